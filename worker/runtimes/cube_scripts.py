"""The shell scripts the Cube runtime sends into a sandbox, and the glob translation they use.

Each is a ``str.format`` template whose values the runtime quotes (``shlex.quote``) before filling them in.
"""

from __future__ import annotations

PREP_SCRIPT = """set -u
ws={ws}; skill={skill}; up={upload}; inputs={inputs}; keep={keep}; stamp={stamp}
mkdir -p -- "$ws/work/inputs" "$ws/out" "$ws/runs" 2>/dev/null || {{
  echo "cannot create the workspace under ${{ws%/*}}: it must exist or be creatable, and be writable by $(id -un 2>/dev/null || id -u)" >&2; exit 3; }}
if [ -n "$inputs" ]; then
  tar -xf "$up" -C "$ws" --no-same-owner --delay-directory-restore --wildcards 'work/*'; rc=$?
  [ -n "$keep" ] || rm -f -- "$up"; [ $rc -eq 0 ] || exit 4
fi
have=; IFS= read -r have 2>/dev/null < "$ws/skills/.$skill.signature"
[ -f "$ws/skills/$skill/SKILL.md" ] && echo "sig=$have" || echo missing
r="$ws/runs/run_$stamp"; i=0
while ! mkdir -m 700 -- "$r" 2>/dev/null; do i=$((i+1)); [ $i -gt 100 ] && exit 5; r="$ws/runs/run_$stamp-$i"; done
echo "run=$r"
{cwd_check}
"""
"""The sandbox user's part of preparing a run: the workspace's folders, the run's inputs, the run folder."""

STAGE_SCRIPT = """set -u
ws={ws}; skill={skill}; up={upload}; signature={signature}; name=${{ws##*/}}
refuse() {{ echo "refusing to stage into $ws: $1" >&2; rm -f -- "$up"; exit 3; }}
as_root=; [ "$(id -u)" = 0 ] && as_root=1
# Everything below works on the folders it has entered (cd -P), never on names a command could swap for links.
rootp=$(cd -P -- "${{ws%/*}}" 2>/dev/null && pwd -P) || refuse "its parent folder is missing"
cd -P -- "$rootp" || refuse "its parent folder is missing"
# The workspaces folder: root's and sticky, so the sandbox user cannot rename or replace a workspace in it.
if [ -n "$as_root" ]; then chown 0:0 . && chmod 1777 . || refuse "cannot take $rootp"; fi
cd -P -- "$name" 2>/dev/null && [ "$(pwd -P)" = "$rootp/$name" ] || refuse "it is not a plain folder"
if [ -n "$as_root" ]; then chown 0:0 . && chmod 755 . || refuse "cannot take it"; fi
[ -L skills ] && rm -f skills
mkdir -p skills && cd -P skills && [ "$(pwd -P)" = "$rootp/$name/skills" ] || refuse "skills/ is not a plain folder"
if [ -n "$as_root" ]; then chown 0:0 . && chmod 755 . || refuse "cannot take skills/"; fi
cd .. || exit 3
[ -f {metadata} ] || printf '%s\\n' {metadata_json} > {metadata}
chmod -R u+w -- "skills/$skill" 2>/dev/null; rm -rf -- "skills/$skill"
tar -xf "$up" -C . --no-same-owner --delay-directory-restore --wildcards 'skills/*'; rc=$?
rm -f -- "$up"; [ $rc -eq 0 ] || exit 4
printf '%s' "$signature" > "skills/.$skill.signature"
"""
"""Staging, as root in the sandbox: the workspaces folder becomes root's and sticky, the workspace folder and
``skills/`` root's, so the command (the sandbox user) can change neither the staged skill nor which folder is
staged, and no link it plants is followed; ``work/``, ``out/`` and ``runs/`` stay the user's."""

FAST_MISS_EXIT_CODE = 97
FAST_GUARD = """s={ws}/skills/.{skill}.signature; IFS= read -r have 2>/dev/null < "$s"
if [ "$have" != {signature} ] || ! mkdir -p -- {ws}/work/inputs {ws}/out 2>/dev/null || ! mkdir -m 700 -- {run} 2>/dev/null; then
  echo {nonce} >&2; exit {code}; fi
"""
"""Before a command in a workspace this process staged: the skill is still there, unchanged, and the run folder
is new; else the command is not run, and the runtime takes the full way (``PREP_SCRIPT``)."""

PACK_SCRIPT = """(set -u
ws={ws}; t={pack_dir}; cap={cap}; budget={budget}; most={most}
mkdir -m 700 -- "$t" && mkdir "$t/heads" && : > "$t/list" && : > "$t/heads.list" && : > "$t/{sizes}" || exit 3
printf %s {patterns} | base64 -d > "$t/patterns" || exit 3
cd -- "$ws" || exit 3; n=0
add() {{  # a regular file: whole, or its head with its true size alongside
  local path=$1 size=$2 take=$2
  [ $cap -ge 0 ] && [ $take -gt $cap ] && take=$cap; [ $take -gt $budget ] && take=$budget
  budget=$((budget-take))
  if [ $take -lt $size ]; then
    mkdir -p -- "$t/heads/$(dirname -- "$path")"; head -c $take -- "$path" > "$t/heads/$path"
    printf '%s\\0' "$path" >> "$t/heads.list"; printf '%s\\0%s\\0' "$path" "$size" >> "$t/{sizes}"
  else
    printf '%s\\0' "$path" >> "$t/list"
  fi
}}
while IFS= read -r -d '' base && IFS= read -r -d '' depth && IFS= read -r -d '' re; do
  real=$(realpath -e -- "$base" 2>/dev/null) || continue
  case "$real" in "$ws") rel=.;; "$ws"/*) rel="./${{real#"$ws"/}}";; *) continue;; esac
  span=(); [ "$depth" -gt 0 ] && span=(-mindepth "$depth" -maxdepth "$depth")
  while IFS= read -r -d '' line; do
    kind=${{line%% *}}; line=${{line#* }}; size=${{line%% *}}; sub=${{line#* }}
    [[ $sub =~ $re ]] || continue
    n=$((n+1)); [ $n -gt $most ] && break 2
    path="$rel/$sub"; path=${{path#./}}
    if [ "$kind" = f ]; then add "$path" "$size"; continue; fi
    printf '%s\\0' "$path" >> "$t/list"
    if [ "$kind" = l ] && target=$(realpath -e -- "$path" 2>/dev/null) && [ -f "$target" ]; then
      case "$target" in "$ws"/*) add "${{target#"$ws"/}}" "$(stat -c %s -- "$target")";; esac
    fi
  done < <(find "$rel" "${{span[@]}}" \\( -type f -o -type l -o -type p -o -type c -o -type b -o -type s \\) \\
             -printf '%y %s %P\\0' 2>/dev/null)
done < "$t/patterns"
tar -cf "$t/out.tar" --null --no-recursion --hard-dereference -C "$ws" -T "$t/list" -C "$t/heads" -T "$t/heads.list" \\
  -C "$t" {sizes} || exit 4)
"""
"""Pack what output patterns may match into ``<pack_dir>/out.tar``: whole files up to the per-file cap and the
byte budget, heads of longer ones (their true sizes in the sizes member), links, FIFOs and devices as they are."""


def glob_regex(segments: list[str]) -> str:
    """A POSIX extended regular expression for a path below a folder that matches the glob ``segments`` as
    collection does: ``*``, ``?`` and ``[...]`` within one name (not a leading dot), ``**`` any number of
    folders."""
    parts: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append("([^/.][^/]*/)*" + ("[^/.][^/]*" if last else ""))
            continue
        parts.append(_segment_regex(segment) + ("" if last else "/"))
    return "^" + "".join(parts) + "$"


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        close = segment.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("([^/.][^/]*)?" if i == 0 else "[^/]*")
        elif c == "?":
            out.append("[^/.]" if i == 0 else "[^/]")
        elif close > 0:
            body = segment[i + 1 : close].replace("/", "")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close
        else:
            out.append("\\" + c if c in _ERE_SPECIAL else c)
        i += 1
    return "".join(out)


_ERE_SPECIAL = frozenset(".^$*+?()[]{}|\\")


__all__ = ["FAST_GUARD", "FAST_MISS_EXIT_CODE", "PACK_SCRIPT", "PREP_SCRIPT", "STAGE_SCRIPT", "glob_regex"]
