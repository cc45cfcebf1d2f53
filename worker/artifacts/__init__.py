"""Artifact stores: output files kept byte for byte, versioned per name (``base``), in a folder (``files``) or an
S3-compatible bucket (``s3``), chosen by the settings (``location``). Exports are imported on first use
(``worker.lazy``): boto3 loads only where the S3 store is used."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.artifacts.base": ["DEFAULT_MAX_ARTIFACT_BYTES", "PRUNE_BATCH", "ArtifactStream", "BaseArtifactStore"],
    "worker.artifacts.files": ["FileArtifactStore"],
    "worker.artifacts.location": ["BlobUrl", "create_artifact_store"],
    "worker.artifacts.s3": ["S3ArtifactStore"],
})
