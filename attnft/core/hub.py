"""A Hugging Face hub's failures as one-line user errors.

Used around every hub call: the store's ``push`` / ``pull`` and model creation's downloads.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional
from urllib.error import URLError

from .errors import AttnftError, OfflineError, StoreError, first_line

OFFLINE = "(HF_HUB_OFFLINE=1 or no network)"


@contextlib.contextmanager
def hub_errors(subject: str, *, hint: str = "", missing: type[AttnftError] = StoreError) -> Iterator[None]:
    """Hub failures inside the block as one line about ``subject`` (``hub repo ORG/NAME``, a model name).

    Unreachable (offline mode, not in the local cache, a failed download): OfflineError, ending
    in ``hint`` (e.g. ``"; pass --checkpoint FILE instead"``). No such repo or file, or an
    invalid repo id: ``missing``. Any other hub HTTP error: StoreError with its first line.
    A hub error that a library wrapped (transformers raises OSError from it) counts as itself;
    any other error passes through unchanged.
    """
    try:
        yield
    except Exception as error:  # the hub's errors have no common base (EntryNotFoundError is no OSError)
        user_error = _user_error(error, subject, hint, missing)
        if user_error is None:
            raise
        raise user_error from None


def _user_error(error: BaseException, subject: str, hint: str, missing: type[AttnftError]) -> Optional[AttnftError]:
    from huggingface_hub.errors import (
        EntryNotFoundError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError,
    )

    seen = set()
    while error is not None and id(error) not in seen:  # the error and what it was raised from
        seen.add(id(error))
        if isinstance(error, LocalEntryNotFoundError):  # before EntryNotFoundError: a subclass
            return OfflineError(f"{subject}: not in the local Hugging Face cache and the hub cannot be reached offline {OFFLINE}{hint}")
        if isinstance(error, OfflineModeIsEnabled):  # an upload, or a download offline mode refused
            return OfflineError(f"{subject}: the hub cannot be reached offline {OFFLINE}{hint}")
        if isinstance(error, (RepositoryNotFoundError, EntryNotFoundError, HFValidationError)):
            return missing(f"{subject}: not found on the hub ({first_line(error)})")
        if isinstance(error, HfHubHTTPError):
            return StoreError(f"{subject}: {first_line(error)}")
        if isinstance(error, URLError):
            return OfflineError(f"{subject}: downloading from the hub failed ({error.reason}){hint}")
        error = error.__cause__ or error.__context__
    return None
