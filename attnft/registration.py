"""Register attnft's bundled models in timm's registry as soon as timm is imported.

``import attnft`` must make ``timm.create_model("vit_fmnist_patch4_28")`` work, but importing
timm costs seconds (torch, torchvision and every model family), far too much for ``import
attnft`` or ``attnft --help``; timm's registry cannot hold a name without being imported. So
when timm is already loaded the bundled models register at once, and otherwise a one-shot
import hook registers them right after timm's own ``__init__`` has run, whoever imports it.
"""
import importlib
import importlib.util
import sys

BUNDLED_MODULE = "attnft.bundled"  # registers its models in timm when imported


def register_bundled_models() -> None:
    """Register now if timm is loaded, else when it loads (cheap: no timm or torch import here)."""
    if "timm" in sys.modules:
        importlib.import_module(BUNDLED_MODULE)
    elif not any(isinstance(finder, _RegisterAfterTimm) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterTimm())


class _RegisterAfterTimm:
    """A meta path finder that finds nothing itself: it hands timm's own spec back, its loader
    set to import :data:`BUNDLED_MODULE` once timm's package has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "timm":
            return None
        sys.meta_path.remove(self)  # one shot; the search below must not find this finder again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_timm = loader.exec_module

        def exec_then_register(module):
            try:
                exec_timm(module)
            finally:
                del loader.exec_module  # the loader's own method again
            importlib.import_module(BUNDLED_MODULE)

        loader.exec_module = exec_then_register
        return spec
