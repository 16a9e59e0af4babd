"""``fireflyer image build``: its arguments and handler (the build itself is ``images.build_images``)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ff_appliance import images

if TYPE_CHECKING:
    from ff_appliance.cli import Cli

EXIT_OK = 0


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the base root file system's tarball is cached: ``$XDG_CACHE_HOME/fireflyer/images`` (``~/.cache``)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "/root")) / ".cache")
    return Path(base) / "fireflyer" / "images"


async def _cmd_image_build(args: argparse.Namespace, cli: Cli) -> int:
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir(cli.environ)
    options = images.BuildOptions(
        checkout=images.find_checkout(args.source),
        cache_dir=cache_dir.absolute(),
        env=dict(cli.environ),
        version=args.version or images.project_version(),
        suite=args.suite,
        mirror=args.mirror,
        find_links=tuple(args.find_links or ()),
        rebuild_base=args.rebuild_base,
        with_trainer=not args.services_only,
    )
    names = await asyncio.to_thread(images.build_images, options, cli.out)
    if args.services_only:
        cli.print(f"built {names.services} (from {names.base}); no trainer image (--services-only)")
    else:
        cli.print(f"built {names.services} and {names.trainer} (from {names.base})")
    return EXIT_OK


def add_image_command(sub: Any) -> None:
    """``fireflyer image build`` on the CLI's subparsers."""
    image = sub.add_parser("image", help="the services' and trainers' OCI images").add_subparsers(
        dest="action", required=True
    )
    p = image.add_parser(
        "build",
        help="build localhost/fireflyer/{base,services,trainer}:VERSION with podman (root; no daemon, no registry)",
    )
    p.add_argument("--source", metavar="DIR", default=None, help="the monorepo's checkout (default: this one)")
    p.add_argument("--cache-dir", metavar="DIR", default=None, help="where the base tarball is cached")
    p.add_argument("--version", default=None, help="the images' tag (default: the appliance's version)")
    p.add_argument("--suite", default=images.DEFAULT_SUITE, help="the Debian suite of the base image")
    p.add_argument("--mirror", default=images.DEFAULT_MIRROR, help="the Debian mirror debootstrap fetches from")
    p.add_argument("--find-links", action="append", metavar="DIR", help="more wheel folders for pip wheel (repeatable)")
    p.add_argument(
        "--services-only",
        action="store_true",
        help="build the base and services images only, not the trainer image (torch: most of a build's time)",
    )
    p.add_argument("--rebuild-base", action="store_true", help="import the base image again even if it exists")
    p.set_defaults(handler=_cmd_image_build)
