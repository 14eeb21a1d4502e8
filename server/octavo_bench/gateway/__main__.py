"""``python -m octavo_bench.gateway``: run the minimal gateway (see proxy.py) as a process.

--picker HOST:PORT      ask this endpoint picker (ext_proc, plaintext gRPC) per request
--endpoints A,B,C       or send requests to these ip:port in turn (round-robin)
"""

from __future__ import annotations

import argparse

import uvicorn

from octavo_bench.gateway.proxy import Router, build_app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m octavo_bench.gateway", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--picker", help="the endpoint picker's ext_proc address, host:port")
    where.add_argument("--endpoints", help="comma-separated ip:port list for round-robin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    endpoints = tuple(e for e in (args.endpoints or "").split(",") if e)
    app = build_app(Router(picker=args.picker, endpoints=endpoints))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
