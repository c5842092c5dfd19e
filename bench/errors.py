"""Errors a user can cause in the harness (bad flags, bad run folders, unreadable traces).

Library code raises these; only `bench.cli` turns them into one printed line and exit code 2.
"""


class BenchError(Exception):
    """Base class of every user-caused harness error; its message is one line meant for a person."""


class InputError(BenchError):
    """A flag value that is out of range or malformed (e.g. `--inputs 0`, `--repeats 0`)."""


class RunFolderError(BenchError):
    """A run folder that is missing, exists already, is corrupt, or has an unknown schema version."""


class TraceError(BenchError):
    """A profile trace path that does not exist or is not an xprof trace."""


class MissingModuleError(BenchError):
    """A Python module a command needs that this interpreter cannot import (e.g. one the GPU image lacks)."""


class FleetError(BenchError):
    """A fleet plan, task file, bucket or cloud call that cannot go on (`bench fleet ...`): one line saying what was
    found, what was expected and what to do."""
