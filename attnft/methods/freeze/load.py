"""Loading an adapter onto a base: check it fits (names, regions, fingerprint, shapes), fit the head and
the input size, then copy the trained tensors in."""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from ...core.errors import AdapterError, BaseMismatchError, ConfigError, first_line
from ...core.files import PathLike
from ..fingerprint import compute_fingerprint, unfingerprinted_names
from .policy import Policy, resolve_policy
from ...roles import Region, RoleMap, build_role_map
from ..base_model import base_build_kwargs, current_input_size
from .config import Adapter, AdapterConfig, region_from_json
from .read import read_adapter


def load_adapter(
    model: nn.Module,
    path_or_adapter: Union[PathLike, Adapter],
    *,
    ignore_fingerprint: bool = False,
    base_fingerprint: Optional[str] = None,
    num_classes: Optional[int] = None,
    policy: Optional[str] = None,
) -> AdapterConfig:
    """Write an adapter's trained tensors into ``model`` in place.

    Checks, before touching the model: the caller's expectations (``num_classes``, ``policy``),
    that the adapter holds exactly the tensors its policy trains on this model, and that the
    model is the base the adapter was trained on (fingerprint). Then resets the classifier to
    the adapter's classes and the input size to the adapter's, and copies.

    Args:
        model: the base the adapter was trained on, at any input size; changed in place.
        path_or_adapter: an attnft adapter folder, or an ``Adapter`` already read.
        ignore_fingerprint: skip the base check (experts only: the weights must be the same).
        base_fingerprint: the model's fingerprint, if already computed.
        num_classes: if given, the classes the adapter must have.
        policy: if given, the policy spec the adapter must have been trained under.

    Returns:
        The adapter's ``AdapterConfig``.

    Raises:
        AdapterError: files that do not verify, other classes or policy than expected, tensors that do not fit.
        BaseMismatchError: ``model`` is not the base the adapter was trained on.
    """
    adapter = path_or_adapter if isinstance(path_or_adapter, Adapter) else read_adapter(path_or_adapter)
    config = adapter.config
    where = f"adapter {adapter.path}" if adapter.path else "the adapter"
    if num_classes is not None and num_classes != config.num_classes:
        raise AdapterError(f"{where} has {config.num_classes} classes, {num_classes} were expected")
    if policy is not None and (policy.name if isinstance(policy, Policy) else str(policy).strip()) != config.policy:
        raise AdapterError(f"{where} was trained under policy {config.policy!r}, {policy!r} was expected")

    # everything but the head and the grid-sized tables must fit before the model is touched
    role_map = build_role_map(model)
    changing = unfingerprinted_names(model, role_map) | {n for n in config.tensors if role_map.is_head(n)}
    _check_names(role_map, config, where, skip=changing)
    if not ignore_fingerprint:
        found = base_fingerprint or compute_fingerprint(model, role_map)
        if found != config.base_fingerprint:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            cast = f" (this model is {dtype}, the base was {config.dtype}: load the adapter first, then cast)" if dtype != config.dtype else ""
            raise BaseMismatchError(
                f"{where} was trained on base {config.model_name} with fingerprint {config.base_fingerprint[:12]}, "
                f"this model's is {found[:12]}{cast}: load the weights it was trained on, or pass --ignore-fingerprint "
                "(in Python: ignore_fingerprint) if you are sure they match"
            )
    _check_shapes(dict(model.named_parameters()), config, where, skip=changing)

    reference = next(model.parameters())
    if int(getattr(model, "num_classes", config.num_classes)) != config.num_classes:
        model.reset_classifier(config.num_classes)
        # the new head is created on the default device and dtype
        for head in role_map.head_modules():
            model.get_submodule(head).to(device=reference.device, dtype=reference.dtype)
    created_at = current_input_size(model)
    if created_at != config.input_size:
        _fit_input_size(model, created_at, config.input_size, where)
    _check_names(build_role_map(model), config, where)
    params = dict(model.named_parameters())
    hint = f"; create the base at that size (--res {config.input_size}, img_size={config.input_size} in Python)" if created_at != config.input_size else ""
    _check_shapes(params, config, where, hint=hint)

    values = adapter.trained_values(model)
    with torch.no_grad():
        for name, value in values.items():
            param = params[name]
            region = region_from_json(config.tensors[name].get("region"))
            target = param if region is None else param[region.index(param.ndim)]
            target.copy_(value.to(device=param.device, dtype=param.dtype))
    return config


def expected_tensors(role_map: RoleMap, policy: Union[str, Policy]) -> dict[str, Optional[Region]]:
    """What freezing policy ``policy`` trains on a model with ``role_map``: name -> None (whole) or the
    trained region; :meth:`attnft.methods.freeze.policy.Policy.select`, the selection training makes."""
    return resolve_policy(policy).select(role_map)


def _check_names(role_map: RoleMap, config: AdapterConfig, where: str, skip: set[str] = frozenset()) -> None:
    """The adapter holds exactly the tensors (and regions) its policy trains on this model."""
    expected = expected_tensors(role_map, config.parsed_policy)
    missing = [n for n in expected if n not in config.tensors and n not in skip]
    extra = [n for n in config.tensors if n not in expected and n not in skip]
    if missing or extra:
        detail = "; ".join(
            part for part in (
                f"missing {len(missing)} ({', '.join(missing[:3])})" if missing else "",
                f"{len(extra)} unknown to this model ({', '.join(extra[:3])})" if extra else "",
            ) if part
        )
        raise AdapterError(f"{where} ({config.model_name}, policy {config.policy}) does not fit this {role_map.model_name}: {detail}")
    for name, region in config.regions.items():
        if name not in skip and region != expected[name]:
            raise AdapterError(f"{where}: {name} trains region {region}, this model's policy trains {expected[name]}")


def _check_shapes(params: dict, config: AdapterConfig, where: str, skip: set[str] = frozenset(), hint: str = "") -> None:
    for name, entry in config.tensors.items():
        if name in skip:
            continue
        if list(params[name].shape) != list(entry["shape"]):
            raise AdapterError(
                f"{where}: {name} has shape {tuple(entry['shape'])}, the model's is {tuple(params[name].shape)} "
                f"(adapter for {config.model_name} at {config.input_size}px){hint}"
            )


def _fit_input_size(model: nn.Module, created_at: int, size: int, where: str) -> None:
    """Make a model created at ``created_at`` pixels run at ``size``: timm's set_input_size rebuilds
    the patch grid and resamples position tables (the adapter's are written over them next)."""
    if hasattr(model, "set_input_size"):
        model.set_input_size(img_size=(size, size))
        return
    from timm.models import get_model_input_config

    if get_model_input_config(model)["fixed_input_size"]:
        raise AdapterError(
            f"{where} was trained at {size}px, this {type(model).__name__} was created at {created_at}px "
            f"and cannot be resized in place: create the base at that size (--res {size}, img_size={size} in Python)"
        )
    # a model that takes any input size (PVTv2) needs nothing; grid-sized tables are checked next


def check_fits_base_at_its_size(config: AdapterConfig, where: str) -> None:
    """AdapterError unless the adapter fits its base built at its input size: the position tables it stores have
    that grid's shape, and the base takes one image of that size. The base is built on the meta device from the
    recorded name and arguments, so nothing is allocated or read. Only a base timm builds from its code alone is
    checked (a registered architecture: no hub config or folder is fetched); when the recorded arguments do not
    rebuild the base as trained, or the meta device cannot run it, nothing is said here: loading checks the real one."""
    from ...models import builds_from_code, create_model

    if not builds_from_code(config.model_name):
        return
    size, kwargs = config.input_size, base_build_kwargs(config.model_args)
    with torch.device("meta"):
        try:
            create_model(config.model_name, pretrained=False, num_classes=config.num_classes, **kwargs)
        except Exception:  # noqa: BLE001  not rebuilt from what was recorded: its load says what is wrong
            return
        try:  # the base builds: at the adapter's size too?
            model = create_model(config.model_name, pretrained=False, img_size=size, num_classes=config.num_classes,
                                 **kwargs)
        except ConfigError as e:  # attnft's own refusal of the size (a multiple of the patch, the windows)
            raise AdapterError(f"{where}: input_size {size}: {first_line(e)}") from None
        except Exception:  # noqa: BLE001  something else of this build: its load says
            return
        role_map = build_role_map(model)
        params = dict(model.named_parameters())
        shapes = {name: list(params[name].shape) if name in params else None for name in config.tensors}
        if any(shapes[name] != list(entry["shape"]) for name, entry in config.tensors.items()
               if not role_map.is_grid_sized(name)):
            return  # not the base it was trained on: the shapes that do not depend on the size differ
        for name, entry in config.tensors.items():
            if shapes[name] != list(entry["shape"]):
                raise AdapterError(f"{where}: input_size {size}: {name} has shape {tuple(entry['shape'])}, "
                                   f"{config.model_name} at {size} px has {tuple(shapes[name] or ())}")
        try:
            with torch.no_grad():
                model.eval()(torch.empty(1, 3, size, size))
        except (NotImplementedError, RuntimeError) as e:
            if "meta" in str(e) or isinstance(e, NotImplementedError):
                return  # the meta device cannot run this model: its load says
            raise AdapterError(f"{where}: input_size {size}: {config.model_name} cannot take {size} px images "
                               f"({first_line(e)})") from None
        except Exception as e:  # noqa: BLE001  what the model says of the size, in one line
            raise AdapterError(f"{where}: input_size {size}: {config.model_name} cannot take {size} px images "
                               f"({first_line(e)})") from None
