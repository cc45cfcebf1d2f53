from tests.integration.conftest import docker_engine  # noqa: F401 - the same session-wide engine
