"""Synthetic skill libraries of any size, with labelled requests, for the injection benchmark and the scale tests.

Each skill is one action on one kind of business object (``reconcile-invoices-17``). Its description says what it
does and, as well-written skill descriptions do, when to use it, in the user's words (``Use when someone asks to
match up or balance their bills``). A labelled request names the task the way a user would — mostly in the
"when to use" words, not the skill's name — so finding the skill takes real retrieval, not a name lookup.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

# action: (verb phrase in the description, user phrasings)
ACTIONS = {
    "convert": ("Convert", ["turn", "change the format of", "transform"]),
    "validate": ("Validate", ["check for mistakes in", "verify", "sanity-check"]),
    "summarize": ("Summarize", ["give me the gist of", "condense", "boil down"]),
    "translate": ("Translate", ["put into another language", "localize", "render in French"]),
    "archive": ("Archive", ["store away", "put into cold storage", "shelve"]),
    "deduplicate": ("Deduplicate", ["remove repeated", "drop double entries in", "merge duplicate"]),
    "encrypt": ("Encrypt", ["lock with a key", "protect with a cipher", "scramble securely"]),
    "forecast": ("Forecast", ["predict next quarter's", "project future", "estimate upcoming"]),
    "reconcile": ("Reconcile", ["match up", "balance", "tie out"]),
    "anonymize": ("Anonymize", ["strip personal data from", "mask names in", "redact identities in"]),
    "chart": ("Chart", ["plot", "draw a graph of", "visualize"]),
    "schedule": ("Schedule", ["book a time for", "plan a slot for", "put on the calendar"]),
    "compress": ("Compress", ["shrink", "make smaller", "zip up"]),
    "audit": ("Audit", ["inspect the history of", "review the trail of", "look for irregularities in"]),
    "merge": ("Merge", ["combine", "join together", "consolidate"]),
    "export": ("Export", ["download a copy of", "send out", "dump"]),
    "import": ("Import", ["load in", "bring in", "ingest"]),
    "classify": ("Classify", ["sort into categories", "tag by type", "label"]),
    "redact": ("Redact", ["black out secrets in", "hide confidential parts of", "censor"]),
    "index": ("Index", ["make searchable", "catalogue", "build a lookup for"]),
    "sign": ("Sign", ["put a digital signature on", "endorse electronically", "notarize"]),
    "print": ("Print", ["make paper copies of", "send to the printer", "produce hard copies of"]),
    "parse": ("Parse", ["read the fields of", "extract structure from", "pull values out of"]),
    "backup": ("Back up", ["keep a safety copy of", "snapshot", "save a spare copy of"]),
    "restore": ("Restore", ["bring back", "recover", "roll back"]),
    "approve": ("Approve", ["sign off on", "green-light", "accept"]),
    "notify": ("Send notifications about", ["alert people about", "ping the team about", "email reminders about"]),
    "rank": ("Rank", ["order by importance", "prioritize", "sort best first"]),
    "sample": ("Sample", ["pick a random subset of", "draw a few examples of", "spot-check"]),
    "diff": ("Diff", ["compare two versions of", "spot changes between", "find differences in"]),
    "monitor": ("Monitor", ["keep an eye on", "watch", "track changes to"]),
    "price": ("Price", ["put a cost on", "quote", "estimate the cost of"]),
    "geocode": ("Geocode", ["find coordinates for", "place on a map", "locate the addresses of"]),
    "transcribe": ("Transcribe", ["write down", "turn speech into text for", "caption"]),
    "cluster": ("Cluster", ["group similar", "find segments of", "bucket together"]),
}

# object: (noun in the description, user's words for it)
OBJECTS = {
    "invoices": ("invoices", ["bills", "billing statements"]),
    "receipts": ("receipts", ["till slips", "proofs of purchase"]),
    "contracts": ("contracts", ["agreements", "signed deals"]),
    "payslips": ("payslips", ["salary statements", "wage slips"]),
    "timesheets": ("timesheets", ["hours worked", "time logs"]),
    "spreadsheets": ("spreadsheets", ["excel workbooks", "sheets"]),
    "emails": ("emails", ["inbox messages", "mail threads"]),
    "photos": ("photos", ["pictures", "snapshots from the camera"]),
    "videos": ("videos", ["clips", "recordings"]),
    "podcasts": ("podcasts", ["audio episodes", "radio shows"]),
    "tickets": ("support tickets", ["helpdesk requests", "customer complaints"]),
    "leads": ("sales leads", ["prospects", "potential customers"]),
    "orders": ("purchase orders", ["POs", "procurement requests"]),
    "shipments": ("shipments", ["parcels", "deliveries"]),
    "inventory": ("inventory counts", ["stock levels", "warehouse stock"]),
    "budgets": ("budgets", ["spending plans", "cost allocations"]),
    "forecasts": ("sales forecasts", ["revenue projections", "pipeline outlooks"]),
    "resumes": ("resumes", ["CVs", "job applications"]),
    "surveys": ("survey responses", ["questionnaire answers", "poll results"]),
    "logs": ("server logs", ["application log files", "syslog output"]),
    "metrics": ("service metrics", ["dashboards numbers", "telemetry"]),
    "certificates": ("TLS certificates", ["SSL certs", "x509 certificates"]),
    "passwords": ("password vaults", ["credential stores", "secrets manager entries"]),
    "schemas": ("database schemas", ["table definitions", "DDL"]),
    "migrations": ("database migrations", ["schema changes", "alembic revisions"]),
    "datasets": ("training datasets", ["ML data", "labelled examples"]),
    "models": ("machine-learning models", ["trained networks", "model checkpoints"]),
    "maps": ("map tiles", ["GIS layers", "cartography"]),
    "recipes": ("recipes", ["cooking instructions", "meal plans"]),
    "playlists": ("playlists", ["song lists", "music queues"]),
    "patents": ("patent filings", ["intellectual property claims", "inventions"]),
    "grants": ("grant proposals", ["funding applications", "research bids"]),
    "lectures": ("lecture notes", ["course material", "class slides"]),
    "exams": ("exam papers", ["tests for students", "quizzes"]),
    "prescriptions": ("prescriptions", ["medication orders", "doctor's scripts"]),
    "claims": ("insurance claims", ["damage reports", "reimbursement requests"]),
    "leases": ("property leases", ["rental agreements", "tenancy contracts"]),
    "flights": ("flight bookings", ["plane tickets", "air travel reservations"]),
    "hotels": ("hotel reservations", ["room bookings", "accommodation"]),
    "expenses": ("expense reports", ["out-of-pocket costs", "travel spending"]),
    "tax": ("tax returns", ["tax filings", "VAT declarations"]),
    "loans": ("loan applications", ["mortgage requests", "credit applications"]),
    "vendors": ("vendor records", ["supplier details", "partner companies"]),
    "assets": ("fixed assets", ["equipment register", "company property"]),
    "meetings": ("meeting minutes", ["call notes", "stand-up notes"]),
    "translations": ("translation memories", ["glossaries", "term bases"]),
    "newsletters": ("newsletters", ["mailing campaigns", "bulletins"]),
    "reviews": ("product reviews", ["customer ratings", "star ratings"]),
    "code": ("source code repositories", ["git repos", "codebases"]),
    "containers": ("container images", ["docker images", "OCI images"]),
    "dns": ("DNS zones", ["domain records", "nameserver entries"]),
    "firewalls": ("firewall rules", ["network ACLs", "security groups"]),
    "backups": ("backup sets", ["tape archives", "snapshots of disks"]),
    "calendars": ("team calendars", ["shared agendas", "availability"]),
    "forms": ("web forms", ["sign-up forms", "form submissions"]),
    "sensors": ("sensor readings", ["IoT measurements", "device telemetry"]),
    "genomes": ("genome sequences", ["DNA reads", "FASTQ files"]),
    "molecules": ("molecule structures", ["chemical compounds", "SMILES strings"]),
    "transcripts": ("call transcripts", ["conversation records", "chat logs"]),
    "permits": ("building permits", ["planning applications", "construction approvals"]),
}

MAX_SKILLS = len(ACTIONS) * len(OBJECTS)
_DETAILS = [
    "Works on single files or whole folders and writes a report to out/.",
    "Handles large batches and reports every item it could not process.",
    "Keeps the originals untouched and writes results next to them.",
    "Reads CSV, JSON or PDF input and explains each step it takes.",
]
_OPENERS = ["Could you", "Please", "I need to", "Help me", "Can you", "I want to"]
_TAILS = ["for the quarterly review", "before Friday", "for our team", "from last month", "for the auditors", ""]


@dataclass(frozen=True)
class LabelledRequest:
    """A user message and the one skill that serves it."""

    text: str
    skill: str


def _combos(size: int) -> list[tuple[str, str]]:
    if size > MAX_SKILLS:
        raise ValueError(f"at most {MAX_SKILLS} synthetic skills")
    combos = [(a, o) for o in OBJECTS for a in ACTIONS]
    random.Random(7).shuffle(combos)
    return combos[:size]


def skill_name(index: int, action: str, obj: str) -> str:
    return f"{action}-{obj}-{index}"


def write_library(root: Path, size: int) -> list[str]:
    """Write ``size`` skills under ``root`` (each with a runnable ``scripts/run.sh``); return their names."""
    names = []
    for index, (action, obj) in enumerate(_combos(size)):
        verb, phrasings = ACTIONS[action]
        noun, words = OBJECTS[obj]
        name = skill_name(index, action, obj)
        folder = root / name
        (folder / "scripts").mkdir(parents=True)
        description = (
            f"{verb} {noun}. {_DETAILS[index % len(_DETAILS)]} Use when someone asks to {phrasings[0]} or "
            f"{phrasings[1]} their {words[0]} or {words[1]}."
        )
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {description}\n---\n# {verb} {noun}\n\n"
            f"Run `bash scripts/run.sh <file>`; the result goes to $OUTPUT_DIR/result.txt.\n"
        )
        (folder / "scripts" / "run.sh").write_text(f'mkdir -p "$OUTPUT_DIR" && echo "{name} done" > "$OUTPUT_DIR/result.txt"\n')
        names.append(name)
    return names


def labelled_requests(size: int, count: int = 60, seed: int = 11) -> list[LabelledRequest]:
    """``count`` requests, each served by one skill of the ``size``-skill library."""
    rng = random.Random(seed + size)
    combos = list(enumerate(_combos(size)))
    picked = [combos[i % len(combos)] for i in rng.sample(range(len(combos)), min(count, len(combos)))]
    while len(picked) < count:
        picked.append(rng.choice(combos))
    requests = []
    for index, (action, obj) in picked:
        _, phrasings = ACTIONS[action]
        _, words = OBJECTS[obj]
        text = f"{rng.choice(_OPENERS)} {rng.choice(phrasings)} our {rng.choice(words)} {rng.choice(_TAILS)}".strip()
        requests.append(LabelledRequest(text=text + ".", skill=skill_name(index, action, obj)))
    return requests
