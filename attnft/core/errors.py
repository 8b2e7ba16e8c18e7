"""User-facing errors.

Anything a user can cause (a bad flag, a wrong file, a mismatched base, corrupt input)
raises a subclass of :class:`AttnftError`. The CLI turns it into one line on stderr and
exit code 2; everything else is a programming error and keeps its traceback.
"""


class AttnftError(Exception):
    """Base class of errors a user can cause and fix."""


class UnknownModelError(AttnftError):
    """The model name is not a timm model, a hub id or a local path we can read."""


class UnknownPolicyError(AttnftError):
    """The policy name or a role in a policy spec is not known."""


class UnknownSpecName(UnknownPolicyError):
    """No family knows a spec's name (the fallback family raises it; the registry names every family's specs)."""


class NoAttentionError(AttnftError):
    """The model has no attention weights, so attention policies make no sense."""


class AdapterError(AttnftError):
    """An adapter is missing, corrupt, incomplete or does not fit the model."""


class BaseMismatchError(AdapterError):
    """An adapter was trained on a different base model than the one given."""


class StoreError(AttnftError):
    """A store operation was refused (bad name, existing adapter, missing adapter)."""


class DiskFullError(StoreError):
    """A write found no space left: a full disk, or the user's quota. What attnft writes is whole or absent, so
    freeing some space and running the command again is the fix (a comparison then resumes where it stopped)."""


class DataError(AttnftError):
    """A dataset, split or column cannot be found or read."""


class ConfigError(AttnftError):
    """A configuration or recipe value is invalid."""


class OfflineError(AttnftError):
    """A hub download was needed while offline."""


class DivergedError(AttnftError):
    """Training diverged (a loss or a trained weight became NaN or inf); nothing was saved."""


class ReportedElsewhere(AttnftError):
    """Raised on the other processes of a distributed run when the main process stopped it with a
    user error: it exits with code 2 quietly, the main process prints the one line."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of a library's error message (its type's name if it has none), for a one-line user error."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]
