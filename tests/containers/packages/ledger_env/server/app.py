"""The server, as OpenEnv's own environments declare it (with OpenEnv's web interface, which pulls
in Gradio: the image has it, whatever the platform's own Python has)."""

from openenv.core.env_server import create_app
from openenv.core.env_server.web_interface import create_web_interface_app  # noqa: F401

from ledger_env.models import LedgerAction, LedgerObservation
from ledger_env.server.ledger_environment import LedgerEnvironment

app = create_app(LedgerEnvironment, LedgerAction, LedgerObservation, env_name="ledger_env",
                 max_concurrent_envs=64)


def main() -> None:
    import uvicorn

    uvicorn.run(app, host="0.0.0.0", port=8000)


if __name__ == "__main__":
    main()
