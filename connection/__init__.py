"""One Temporal connection configuration for the worker, the watcher and ``retire``.

    parser = argparse.ArgumentParser()
    add_connection_flags(parser)
    args = parser.parse_args()
    settings = resolve(ConnectionFlags.from_args(args), environ=os.environ)  # may raise
    client = await connect(settings)

``resolve`` reads ``temporalio.envconfig`` profiles and the standard ``TEMPORAL_*``
variables with the flags on top (order in ``connection.settings``), and raises
``ConnectionConfigError`` with a one-line reason that callers turn into exit code 2.
"""

from connection.client import connect, connect_retrying
from connection.errors import ConnectionConfigError
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.settings import ConnectionSettings, resolve

__all__ = [
    "ConnectionConfigError",
    "ConnectionFlags",
    "ConnectionSettings",
    "add_connection_flags",
    "add_task_queue_flag",
    "connect",
    "connect_retrying",
    "resolve",
]
