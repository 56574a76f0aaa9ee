"""Errors that the CLI turns into one `error: ...` line and exit status 2."""


class KvboundError(Exception):
    """Bad input or a request kvbound cannot serve; the message is shown to the user as is."""


class InputError(KvboundError):
    """A case file, trace, schedule or option is malformed.

    The message names the source (file), the field and the problem.
    """

    def __init__(self, source: str, field: str, problem: str):
        self.source, self.field, self.problem = source, field, problem
        where = f"{source}: " if source else ""
        field_part = f"{field}: " if field else ""
        super().__init__(f"{where}{field_part}{problem}")


class SchedulerRefused(KvboundError):
    """A scheduler cannot serve an instance under its own rules (decided before it runs)."""


class SchedulerStuck(KvboundError):
    """A scheduler stopped making progress (livelock); names the policy and the state."""
