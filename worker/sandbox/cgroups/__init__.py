"""Control groups for runs: per-run limits (``groups``), groups kept between runs (``pool``), and where they go
(``hierarchies``)."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.sandbox.cgroups.groups": ["CgroupError", "CgroupLimits", "CgroupTree", "RunCgroup"],
    "worker.sandbox.cgroups.pool": ["CgroupPool"],
})
