"""Review flood: one replica driven at a multiple of what it sustains, as the API server would.

The rig of ``python -m bench flood`` (:mod:`bench.flood`) and of the overload tests; with
``seconds`` short, :func:`run` is the benchmark's quick variant:

1. starts one server with the service's serving defaults (gunicorn, the webhook's gevent
   worker, one worker process, TLS) answering from the review benchmark's in-process
   cluster: a warm :class:`~harness.doubles.StaticClusterView` of a full node and an
   in-memory ledger (:mod:`harness.review_cluster`); every review preempts one pod;
2. measures its saturation: 4 kept-alive connections posting reviews back to back;
3. offers ``factor`` times that rate for ``seconds`` from a client that
   behaves as the API server's webhook client does: an open loop (a review arrives every
   1/rate seconds, whatever the answers do), each on an idle kept-alive connection or a
   new one, each given up after the webhook configuration's ``timeoutSeconds`` (5) - the
   connection is then closed, and the API server fails open without the webhook's answer;
   as client-go's transport, it keeps at most 25 idle connections and closes the rest.

Every answer is checked (:func:`classify`): 200, the uid echoed, and either the full
decision (verdict ``preempt`` or ``fits``, or those given with ``--verdicts``), the overload answer
(allowed, preemption skipped) or the engine failing open (allowed with its warning, no
plan: with the real ledger, a write the API server did not take). Figures: answers by
outcome and status, latency centiles of the answers, the server worker's RSS before and
after, whether it survived. ``--shed-delay 0`` switches the overload answer off (the
server as it was before it had one) for the before/after comparison.

The same client floods the service itself, with its Lease ledger and a real kubelet, in
:mod:`harness.cluster_flood` (``python -m bench flood-cluster``). Its two processes are
``python -m harness.flood serve|drive``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.hostile_clients import client_context
from harness.local_server import free_port, read_response, rss_kb, wait_ready, worker_pids
from harness.review_cluster import REVIEW_UID, cluster_objects, review_body

REPO = Path(__file__).resolve().parents[1]

#: The webhook configuration's timeoutSeconds (deploy/base, the chart's default).
API_SERVER_TIMEOUT = 5.0
#: More than one worker holds (gunicorn's worker_connections, 1,000): the API server
#: opens connections as its requests need them.
MAX_CONNECTIONS = 1500
#: Idle connections the API server's webhook client keeps per host (client-go's
#: transport cache, ``idleConnsPerHost``); a connection freed beyond them is closed.
MAX_IDLE = 25
#: Marks the overload answer (webhook.web.app).
OVERLOADED = b"overloaded"
#: Starts the warning of an answer that failed open (webhook.engine.admission.PREFIX).
FAILED_OPEN = b'"resize-preemption: could not'


# -- the server process ------------------------------------------------------------------


def serve_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="flood serve")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--shed-delay", type=float, default=None)
    parser.add_argument("--relist", help="PodList pages to relist over and over, one per line")
    parser.add_argument("--relist-log", help="one JSON line per relist: pods, seconds")
    args = parser.parse_args(argv)

    from harness.doubles import InMemoryLedger, StaticClusterView
    from harness.shed_worker import FloodServer, ShedWorker
    from webhook.base.loop import Backlog
    from webhook.base.settings import Config
    from webhook.engine.admission import AdmissionEngine
    from webhook.tls.serving import CertificateReloader
    from webhook.web.app import create_app
    from webhook.web.server import ServerOptions, WorkerApp

    decisions = logging.getLogger("webhook.decisions")
    decisions.setLevel(logging.INFO)
    decisions.addHandler(logging.FileHandler(os.devnull))
    decisions.propagate = False

    def factory(tls: CertificateReloader) -> WorkerApp:
        objects, _ = cluster_objects()
        view = StaticClusterView.from_objects(objects)
        after_review = Backlog(name="after-review")
        engine = AdmissionEngine(Config(), view, InMemoryLedger(), after=after_review.submit)
        app = create_app(engine=engine, readiness=lambda: {"tls": tls.loaded()})

        def start() -> Callable[[], None]:
            after_review.start()
            if args.relist:
                import gevent

                gevent.spawn(_relist_forever, Path(args.relist), Path(args.relist_log))
            return after_review.stop

        return WorkerApp(app, start=start, registry=engine.metrics.registry)

    if args.shed_delay is not None:
        ShedWorker.shed_delay = args.shed_delay  # the forked workers inherit it
    options = ServerOptions(
        cert_file=args.cert,
        key_file=args.key,
        host="127.0.0.1",
        port=args.port,
        metrics_port=None,
        log_level="warning",
    )
    options.validate()
    tls = CertificateReloader(options.cert_file, options.key_file)
    FloodServer(factory, options, tls).run()
    return 0


def _relist_forever(pages: Path, log_path: Path) -> None:
    """The cluster cache's pod reflector in this process, relisting ``pages`` again and
    again, as after a watch expired: each page parsed and converted, the store replaced.
    A page read from the API server waits on its socket, where the worker serves reviews
    meanwhile; reading from a file does not, so each page yields once in its place."""
    import gevent

    from webhook.kube.cache import PODS, ClusterCache
    from webhook.kube.reflector import parse_list_page

    cache = ClusterCache(None)
    reflector = cache.reflector(PODS)

    def read() -> Iterator[Any]:
        with pages.open("rb") as f:
            for line in f:
                gevent.sleep(0)
                yield parse_list_page(line)

    with log_path.open("a") as log:
        while True:
            started = time.monotonic()
            reflector.load_pages(read())
            log.write(
                json.dumps({"pods": len(cache.pods), "seconds": time.monotonic() - started}) + "\n"
            )
            log.flush()


# -- the client process (gevent: thousands of connections, one thread) --------------------


def classify(
    status: int, answer: bytes, uid: bytes, verdicts: Sequence[str]
) -> tuple[str, str | None]:
    """(outcome, verdict) of one answer to the review ``uid``: ``full`` (decided, with one
    of ``verdicts``), ``failed open`` (allowed with the engine's own failure as warning
    and no plan: a ledger write that did not go through), ``overloaded`` (the overload
    answer), or what is wrong with it (``http N``, ``wrong uid``, ``wrong answer``)."""
    if status != 200:
        return f"http {status}", None
    if uid not in answer:
        return "wrong uid", None
    if b'"allowed":true' not in answer:
        return "wrong answer", None
    if OVERLOADED in answer:
        return "overloaded", None
    for verdict in verdicts:
        if f'"verdict":"{verdict}"'.encode() in answer:
            return "full", verdict
    if b'"verdict":' not in answer and FAILED_OPEN in answer:
        return "failed open", None
    return "wrong answer", None


def drive_main(argv: Sequence[str]) -> int:
    """Closed loop (``--closed N``: N connections back to back, the saturation) or open
    loop (``--rate``): prints JSON with every answer's outcome and latency."""
    from gevent import monkey

    monkey.patch_all()
    import socket
    import uuid

    import gevent
    from gevent.pool import Pool

    parser = argparse.ArgumentParser(prog="flood drive")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument(
        "--body", required=True, action="append", help="a review body; several: in turn"
    )
    parser.add_argument(
        "--verdicts",
        # The same resize over and over: the first review preempts, the others are answered
        # with its entry, fits/admitted.
        default="preempt,fits",
        help="the verdicts that are right answers, comma-separated (counted as full)",
    )
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--closed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=API_SERVER_TIMEOUT)
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS)
    parser.add_argument(
        "--warmup", type=float, default=0.0, help="seconds driven first and not counted"
    )
    args = parser.parse_args(argv)

    context = client_context(args.ca)
    # (head, tail) of each body around its uid, which every review replaces.
    bodies: list[tuple[bytes, bytes]] = []
    for path in args.body:
        body = Path(path).read_bytes()
        at = body.index(REVIEW_UID.encode())
        head = (
            f"POST /validate-resize HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body[:at]
        bodies.append((head, body[at + len(REVIEW_UID) :]))
    verdicts = tuple(args.verdicts.split(","))
    idle: list[Any] = []
    counts: dict[str, int] = {}
    by_verdict: dict[str, int] = {}
    latencies: dict[str, list[float]] = {"full": [], "overloaded": [], "failed open": []}
    opened = [0]
    late = [0.0]
    sent = [0]

    def count(outcome: str) -> None:
        counts[outcome] = counts.get(outcome, 0) + 1

    def connect() -> Any:
        opened[0] += 1
        sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", args.port)), server_hostname="127.0.0.1"
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def review(measured: bool = True) -> None:
        """One review as the API server sends it: an idle connection or a new one, the
        whole call (connect included) given up after the timeout. One not ``measured``
        (the warm-up) only opens and warms connections."""
        t0 = time.monotonic()
        sock = None
        head, tail = bodies[sent[0] % len(bodies)]
        sent[0] += 1
        try:
            with gevent.Timeout(args.timeout):
                sock = idle.pop() if idle else connect()
                uid = str(uuid.uuid4()).encode()
                sock.sendall(head + uid + tail)
                status, answer, _ = read_response(sock, b"")
        except gevent.Timeout:
            if measured:
                count("timed out")
            if sock is not None:
                sock.close()
            return
        except OSError:
            if measured:
                count("connection error")
            if sock is not None:
                sock.close()
            return
        latency = (time.monotonic() - t0) * 1000
        outcome, verdict = classify(status, answer, uid, verdicts)
        if measured:
            count(outcome)
            if outcome in latencies:
                latencies[outcome].append(latency)
            if verdict is not None:
                by_verdict[verdict] = by_verdict.get(verdict, 0) + 1
        if len(idle) < MAX_IDLE:
            idle.append(sock)
        else:
            sock.close()

    # The warm-up opens the connections a steady flow keeps (the API server's are open
    # long before a measurement): without it the first second is a burst of handshakes.
    begin = time.monotonic()
    start = begin + args.warmup
    end = start + args.seconds
    # The client shares the machine too: how late its own loop runs is part of every
    # latency it measures, and is reported beside them.
    lags: list[float] = []

    def probe() -> None:
        while time.monotonic() < end:
            due = time.monotonic() + 0.05
            gevent.sleep(0.05)
            lags.append((time.monotonic() - due) * 1000)

    gevent.spawn(probe)
    pool = Pool(args.max_connections)
    if args.closed:

        def loop() -> None:
            while (now := time.monotonic()) < end:
                review(now >= start)

        pool_greenlets = [gevent.spawn(loop) for _ in range(args.closed)]
        gevent.joinall(pool_greenlets)
        offered = sum(counts.values())
    else:
        offered = arrived = 0
        while True:
            due = begin + arrived / args.rate
            if due >= end:
                break
            now = time.monotonic()
            if due > now:
                gevent.sleep(due - now)
            else:
                late[0] = max(late[0], now - due)
            # A full pool (every connection waiting) holds arrivals back: counted as
            # the client falling behind, not as the server's latency.
            pool.spawn(review, due >= start)
            arrived += 1
            offered += due >= start
        pool.join(timeout=args.timeout + 5)
    elapsed = time.monotonic() - start
    json.dump(
        {
            "offered": offered,
            "seconds": round(elapsed, 2),
            "counts": counts,
            "verdicts": by_verdict,
            "latencies_ms": latencies,
            "connections_opened": opened[0],
            "client_behind_s": round(late[0], 3),
            "client_loop_lag_ms": lags,
            "client_cpu_s": round(time.process_time(), 2),
        },
        sys.stdout,
    )
    return 0


# -- orchestration --------------------------------------------------------------------------


@contextlib.contextmanager
def flood_server(
    files: dict[str, Path], shed_delay: float | None, relist: Path | None = None
) -> Iterator[tuple[int, int]]:
    """A flood server on a free port: yields (port, its one worker's pid) once ready;
    with ``relist``, relisting those pages meanwhile (log beside them, ``.log``)."""
    port = free_port()
    command = [sys.executable, "-m", "harness.flood", "serve", "--port", str(port)]
    command += ["--cert", str(files["tls.crt"]), "--key", str(files["tls.key"])]
    if shed_delay is not None:
        command += ["--shed-delay", str(shed_delay)]
    if relist is not None:
        command += ["--relist", str(relist), "--relist-log", str(relist.with_suffix(".log"))]
    server = subprocess.Popen(command, cwd=REPO, start_new_session=True)
    try:
        wait_ready(port, str(files["ca.crt"]), server)
        pids = worker_pids(server.pid)
        if len(pids) != 1:
            raise SystemExit(f"expected one gunicorn worker, found {pids}")
        yield port, pids[0]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def drive_command(
    port: int, ca: Path, bodies: Sequence[Path], seconds: float, **mode: float | str
) -> list[str]:
    """The client (:func:`drive_main`) as a command: ``closed=N`` (the saturation) or
    ``rate=R`` (the open loop), ``verdicts="preempt,fits"`` (the right answers)."""
    command = [sys.executable, "-m", "harness.flood", "drive", "--port", str(port)]
    command += ["--ca", str(ca), "--seconds", str(seconds)]
    for body in bodies:
        command += ["--body", str(body)]
    for name, value in mode.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def drive(
    port: int, ca: Path, bodies: Sequence[Path], seconds: float, **mode: float | str
) -> dict[str, Any]:
    """Runs the client to its end: its JSON figures."""
    command = drive_command(port, ca, bodies, seconds, **mode)
    out = subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=seconds + 120)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def drive_review(
    port: int, files: dict[str, Path], seconds: float, **mode: float
) -> dict[str, Any]:
    return drive(port, files["ca.crt"], [files["review"]], seconds, **mode)


def centiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of latencies in ms, rounded to 0.1 ms (one value: itself)."""
    if len(values) < 2:
        return {"p50_ms": values[0] if values else 0.0, "p99_ms": values[0] if values else 0.0}
    q = statistics.quantiles(values, n=100)
    return {
        "p50_ms": round(statistics.median(values), 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(max(values), 1),
    }


def flood(
    files: dict[str, Path],
    rate: float,
    seconds: float,
    shed_delay: float | None,
    relist: Path | None = None,
) -> dict[str, Any]:
    """One server, flooded at ``rate`` for ``seconds``: the figures of one run."""
    with flood_server(files, shed_delay, relist) as (port, worker):
        rss_before = rss_kb(worker)
        result = drive_review(port, files, seconds, rate=rate)
        alive = os.path.exists(f"/proc/{worker}")
        rss_after = rss_kb(worker) if alive else 0
        # Still answering in full once the flood is over.
        time.sleep(1.0)
        after = drive_review(port, files, 2.0, closed=1)
    answered = result["counts"].get("full", 0) + result["counts"].get("overloaded", 0)
    all_latencies = [x for v in result["latencies_ms"].values() for x in v]
    return {
        "shed_delay_s": shed_delay,
        "offered_per_s": round(result["offered"] / seconds, 1),
        "offered": result["offered"],
        "counts": result["counts"],
        "answered_in_time": answered,
        "server_errors_5xx": sum(n for k, n in result["counts"].items() if k.startswith("http 5")),
        "full_per_s": round(result["counts"].get("full", 0) / seconds, 1),
        "latency_all": centiles(all_latencies),
        "latency_full": centiles(result["latencies_ms"]["full"]),
        "latency_overloaded": centiles(result["latencies_ms"]["overloaded"]),
        "connections_opened": result["connections_opened"],
        "client_behind_s": result["client_behind_s"],
        "client_loop_lag": centiles(result["client_loop_lag_ms"]),
        "client_cpu_s": result["client_cpu_s"],
        "worker_alive": alive,
        "worker_rss_mb": {
            "before": round(rss_before / 1024, 1),
            "after": round(rss_after / 1024, 1),
        },
        "after_flood": after["counts"],
    }


def review_files(tmp: str) -> dict[str, Path]:
    from webhook.tls import pki

    ca = pki.make_ca("flood bench CA")
    pair = pki.make_serving_cert(ca, ip_addresses=["127.0.0.1"])
    files = {name: Path(tmp, name) for name in ("ca.crt", "tls.crt", "tls.key", "review")}
    files["ca.crt"].write_bytes(ca.cert_pem)
    files["tls.crt"].write_bytes(pair.cert_pem)
    files["tls.key"].write_bytes(pair.key_pem)
    _, resizing = cluster_objects()
    files["review"].write_bytes(review_body(resizing))
    return files


def run(
    seconds: float, factor: float, both: bool, shed_delay: float | None = None
) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        files = review_files(tmp)
        with flood_server(files, None) as (port, _):
            saturation = drive_review(port, files, min(10.0, max(3.0, seconds / 6)), closed=4)
        sustained = saturation["counts"].get("full", 0) / saturation["seconds"]
        rate = round(sustained * factor, 1)
        runs = [flood(files, rate, seconds, shed_delay)]
        if both:
            runs.append(flood(files, rate, seconds, 0.0))
    return {
        "benchmark": "review_flood",
        "server": "gunicorn, the webhook's gevent worker, 1 worker (the service's default), "
        "TLS; the review benchmark's in-process cluster (a full node of 110 pods, "
        "in-memory ledger)",
        "client": "open loop, one gevent process; each review on an idle kept-alive "
        f"connection or a new one (up to {MAX_CONNECTIONS}), given up after "
        f"{API_SERVER_TIMEOUT} s",
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "saturation_per_s": round(sustained, 1),
        "factor": factor,
        "seconds": seconds,
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The flood's two processes: ``serve`` (the server) and ``drive`` (the client)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return serve_main(argv[1:])
    if argv and argv[0] == "drive":
        return drive_main(argv[1:])
    raise SystemExit("usage: python -m harness.flood serve|drive ...")


if __name__ == "__main__":
    sys.exit(main())
