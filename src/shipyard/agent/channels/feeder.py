"""The Pipe feeder process of one channel (see pipe.py): ``python -m
shipyard.agent.channels.feeder --source pipe-X.json --input-data DIR [--failure-file F]``.
"""

from __future__ import annotations

import argparse
import os
import sys

from shipyard.agent.channels.pipe import feed
from shipyard.agent.channels.source import ChannelSource
from shipyard.runtime import safepath


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.agent.channels.feeder")
    parser.add_argument("--source", required=True, help="the channel (ChannelSource JSON)")
    parser.add_argument("--input-data", required=True, help="the instance's input/data dir")
    parser.add_argument("--failure-file", default=None)
    args = parser.parse_args(argv)
    source = ChannelSource.load(args.source)

    def log(message: str) -> None:
        sys.stdout.write(f"[shipyard-agent] {message}\n")
        sys.stdout.flush()

    try:
        store, objects = source.objects()
        feed(store, objects, args.input_data, source.name, source.options, log=log)
    except Exception as exc:  # noqa: BLE001 - any failure fails the instance, named
        text = f"channel {source.name!r} (Pipe): {exc}"
        log(text)
        if args.failure_file:  # in the job's tree: written without following its links
            tree = os.path.dirname(os.path.dirname(os.path.abspath(args.input_data)))
            try:
                safepath.write_text(tree, args.failure_file, text[:1024])
            except (OSError, ValueError) as err:
                log(f"could not write the failure file {args.failure_file}: {err}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
