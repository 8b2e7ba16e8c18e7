"""``attnft adapters {list,show,verify,delete,import,export,push,pull}``: manage the adapter store.

Every command takes ``--store DIR`` (default ``$ATTNFT_STORE``, else ``./adapters``). Both
formats of the store are handled: attnft's (freezing policies) and peft's (``lora``, ``ia3``);
``export`` merges attnft adapters only.
"""
import argparse
import json
import textwrap

from ..core.files import check_outside_store


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "adapters",
        help="list, check, delete, import and export stored adapters",
        description="Manage a store of named adapters (attnft's format and peft's).",
    )
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", metavar="DIR", default=None, help="store folder (default: $ATTNFT_STORE or ./adapters)")
    commands = parser.add_subparsers(dest="adapters_command", metavar="ACTION")
    commands.required = True

    p = commands.add_parser("list", parents=[store], help="one line per stored adapter")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(action=run_list)

    p = commands.add_parser("show", parents=[store], help="an adapter's config and files")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(action=run_show)

    p = commands.add_parser("verify", parents=[store], help="check files, header, shapes, classes, sha256 and NaN/inf values (all adapters if no NAME)")
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--num-classes", type=int, default=None, help="also require this many classes")
    p.add_argument("--policy", default=None, help="also require this policy")
    p.set_defaults(action=run_verify)

    p = commands.add_parser("delete", parents=[store], help="remove an adapter")
    p.add_argument("name")
    p.set_defaults(action=run_delete)

    p = commands.add_parser("import", parents=[store], help="copy a verified adapter folder (its regular files; no symlinks) into the store")
    p.add_argument("folder", help="an adapter folder, e.g. a hub download")
    p.add_argument("name")
    p.add_argument("--overwrite", action="store_true", help="replace an existing adapter of that name")
    p.set_defaults(action=run_import)

    p = commands.add_parser("export", parents=[store], help="merge into the base and write a folder plain timm (or, for a transformers base, plain transformers) loads")
    p.add_argument("name")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to create (model.safetensors, config.json, README.md)")
    p.add_argument("--checkpoint", metavar="FILE", default=None, help="the base's weights file (default: its pretrained weights)")
    p.add_argument("--ignore-fingerprint", action="store_true", help="load even if the base's fingerprint differs (experts)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(action=run_export)

    p = commands.add_parser("push", parents=[store], help="upload an adapter folder to a Hugging Face hub model repo")
    p.add_argument("name")
    p.add_argument("repo_id", help="ORG/REPO")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.set_defaults(action=run_push)

    p = commands.add_parser("pull", parents=[store], help="download an adapter from a hub repo, verify it, store it")
    p.add_argument("repo_id", help="ORG/REPO")
    p.add_argument("name")
    p.add_argument("--revision", default=None, help="branch, tag or commit")
    p.add_argument("--overwrite", action="store_true", help="replace an existing adapter of that name")
    p.set_defaults(action=run_pull)
    parser.set_defaults(run=run)


def _store(args):
    from ..adapters.store import AdapterStore

    return AdapterStore(args.store)


def run(args: argparse.Namespace) -> int:
    return args.action(args)


def run_list(args: argparse.Namespace) -> int:
    summaries = _store(args).list()
    if getattr(args, "json", False):
        print(json.dumps([s.to_dict() for s in summaries], indent=2))
        return 0
    if not summaries:
        print(f"no adapters in {_store(args).root}")
        return 0
    name_w = max(len("name"), *(len(s.name) for s in summaries))
    model_w = max(len("model"), *(len(s.model_name) for s in summaries))
    policy_w = max(len("policy"), *(len(s.policy) for s in summaries))
    print(f"{'name':<{name_w}}  {'model':<{model_w}}  {'policy':<{policy_w}}  {'mode':<14} {'classes':>7} {'px':>5} {'MB':>8}  base")
    for s in summaries:
        if s.error:
            print(f"{s.name:<{name_w}}  unreadable: {s.error}")
            continue
        print(
            f"{s.name:<{name_w}}  {s.model_name:<{model_w}}  {s.policy:<{policy_w}}  {s.mode:<14} {s.num_classes:>7} "
            f"{s.input_size:>5} {s.size_bytes / 1e6:>8.2f}  {s.base_fingerprint[:12]}"
        )
    return 0


def run_show(args: argparse.Namespace) -> int:
    store = _store(args)
    info = store.show(args.name)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(store.method(args.name).show_text(info))
    return 0




def run_verify(args: argparse.Namespace) -> int:
    from ..core.errors import AdapterError, AttnftError

    store = _store(args)
    names = args.names or store.names()

    def check(name: str) -> None:
        config = store.verify(name)
        if args.num_classes is not None and config.num_classes != args.num_classes:
            raise AdapterError(f"adapter {name!r} has {config.num_classes} classes, {args.num_classes} were expected")
        if args.policy is not None and config.policy != args.policy:
            raise AdapterError(f"adapter {name!r} was trained under policy {config.policy!r}, {args.policy!r} was expected")

    if len(args.names) == 1:
        check(names[0])  # a failure is the one-line error
        print(f"ok {names[0]}")
        return 0
    failed = 0
    for name in names:
        try:
            check(name)
            print(f"ok {name}")
        except AttnftError as e:
            failed += 1
            print(f"FAILED {name}: {e}")
    if not names:
        print(f"no adapters in {store.root}")
    return 2 if failed else 0


def run_delete(args: argparse.Namespace) -> int:
    store = _store(args)
    store.delete(args.name)
    print(f"deleted {args.name} from {store.root}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    path = _store(args).import_folder(args.folder, args.name, overwrite=args.overwrite)
    print(f"imported {args.folder} as {path}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ..adapters import merge
    from ..core.errors import AdapterError

    store = _store(args)
    check_outside_store(args.out, "--out", store.root)  # (never inside an adapter or export: check_replaceable_folder)
    refusal = store.method(args.name).export_refusal(args.name)
    if refusal:
        raise AdapterError(refusal)
    adapter = store.read(args.name)
    result = merge.export_adapter(  # timm's checkpoint folder, or save_pretrained's for a transformers base
        adapter, args.out, base_checkpoint=args.checkpoint, ignore_fingerprint=args.ignore_fingerprint, overwrite=args.overwrite
    )
    print(f"exported {args.name} to {result.folder}; load it with {result.library} alone:\n")
    print(textwrap.indent(result.load_source(), "    "))
    return 0


def run_push(args: argparse.Namespace) -> int:
    repo_id = _store(args).push(args.name, args.repo_id, private=args.private or None)
    print(f"pushed {args.name} to https://huggingface.co/{repo_id}")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    path = _store(args).pull(args.repo_id, args.name, revision=args.revision, overwrite=args.overwrite)
    print(f"pulled {args.repo_id} into {path} (verified)")
    return 0
