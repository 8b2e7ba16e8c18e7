import sys

from .core.lifetime import exit_with_parent_if_asked

exit_with_parent_if_asked()  # a run that `attnft compare` started ends with it

from .cli import main  # noqa: E402

sys.exit(main())
