"""The attack suite: every known escape, run for real against the runtimes and the API, asserted contained.

Each test's name says what it defends. The local-runtime attacks need root (per-workspace users, namespaces,
cgroups); the Docker ones a real engine; under ``CI=true`` a missing part fails the test instead of skipping it.
"""
