"""Paper 003 (congestion-triggered circuit switching at entry relays) on the netns testbed,
with chive's connection (and, once built, path) switching beside Debian's tor with and
without conflux (issue 16).

The paper's testbed (Sec. 5.1): four clients (OPs) whose links to the relays carry 120, 60,
20 and 10 ms of delay, relays configured at 1.5 Mbit/s, two relay paths (OR1s and OR2s), and
all four clients uploading a 12.3 MB file to one web server at once; the entry relays switch
a congested connection's heaviest circuit away (Algorithm 1).

Testbed (netns backend, root):

* hosts ``C1`` .. ``C4`` (one per client) behind access links with ``client_delays_ms`` of
  one-way delay each way (user-space delay line, ``chive delayline``), not rate-shaped;
* the five relays ``entry1``, ``middle1`` (path 1), ``entry2``, ``middle2`` (path 2) and the
  shared ``exit`` (path mode and conflux need both legs to end at the same exit), held to
  ``relay_rate``: with ``relay_limit = "link"`` (default) each on its own host (``G1``, ``M1``,
  ``G2``, ``M2``, ``E``) behind a ``relay_rate`` access link, so a congested entry's queue
  forms in its socket towards the middle, where the paper's detector looks ("the TCP socket
  cannot accept any more new data"); with ``"bucket"`` all on one unshaped host ``R``, each
  limited by its token bucket (chive ``BandwidthRate``, tor ``BandwidthRate``/``BandwidthBurst``),
  where the queue forms in the circuit queues before the connection's buffer;
* host ``W``: the authority and the web server (``chive httpd``, ``POST /upload`` answers
  the byte count and SHA-256 of what arrived).

Every client pins ``entry1``/``middle1`` (the paper's initial circuits all go through the
OR1s); a variant with ``spare_path`` also allows ``entry2``/``middle2`` (tor with conflux:
the second leg; chive's path mode: the spare circuit). Per client, at the same moment:

* one ``chive perf`` upload of ``upload_bytes`` (SOCKS user ``up``; ``--verify`` checks the
  reply's SHA-256: a mismatch is a failed upload, reported);
* one latency loop (SOCKS user ``lat``, its own circuit on the same path): GET of
  ``latency_bytes`` every ``latency_pause_s`` while the uploads run; request sent to first
  byte is one cell out and one back through the three hops.

Variants (:class:`VariantOptions`): ``impl`` (chive or tor), ``switching`` (chive relays'
``CircuitSwitching``), ``alpha``/``beta`` (``SwitchAlpha``/``SwitchBeta``; a set of
connection variants with different (α, β) is the Fig 4 sweep), ``conflux`` (tor clients'
``ConfluxEnabled``), ``spare_path``, ``relay`` (more chive relay options), ``params`` (consensus
parameters, e.g. ``cc_alg = 2``), ``paper``.

A ``switching = "path"`` variant is skipped (``skipped.json`` with the reason) while the binary's
client has no ``CircuitSwitching`` option; otherwise its clients get ``CircuitSwitching = "path"``
and a ``MetricsFile`` (the client starts path switches and records them).

Per run: ``upload-<client>.jsonl``, ``latency-<client>.jsonl`` (perf records), ``run.json``,
the nodes' directories under ``net/`` (chive relays: ``metrics.jsonl`` with ``switch`` and
per-second ``relay`` records, ``metrics.prom`` scraped at the end; tor: ``tor.json``).
Analysis: :mod:`.analysis`; summary keys in docs/summary-schema.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import netns
from ...errors import LabError
from ...kinds import RepetitionContext
from ...options import option
from .. import bulk
from .. import netns_overlay as no

KIND_NAME = "paper003-switching"
CLIENT_HOSTS = ("C1", "C2", "C3", "C4")
RELAY_HOST, WEB_HOST = "R", "W"
#: Relay nickname -> ORPort. Path 1 is entry1-middle1-exit, path 2 entry2-middle2-exit.
RELAYS = {"entry1": 9001, "middle1": 9002, "entry2": 9003, "middle2": 9004, "exit": 9005}
#: ``relay_limit = "link"``: the host of each relay (its access link runs at ``relay_rate``).
RELAY_HOSTS = {"entry1": "G1", "middle1": "M1", "entry2": "G2", "middle2": "M2", "exit": "E"}
ENTRIES = ("entry1", "entry2")
EXIT = "exit"
#: chive relays' MetricsPort on host R's loopback: METRICS_PORT0 + index in RELAYS.
METRICS_PORT0 = 9301
SOCKS_PORT, HTTP_PORT, DIR_PORT = 9050, 8080, 7000
UPLOAD_USER, LATENCY_USER = "up", "lat"
#: The client option a binary with path switching documents in ``chive client --help``.
_CLIENT_PATH_OPTION = re.compile(r"^\s*CircuitSwitching\s*=", re.M)


def _check_delays(value: tuple[float, ...], path: str) -> tuple[float, ...]:
    if len(value) != len(CLIENT_HOSTS):
        raise LabError(f"{path}: needs one delay per client ({len(CLIENT_HOSTS)}), got {list(value)}")
    return value


@dataclass(frozen=True)
class Params:
    """The scenario's keys of this kind (``scenario.options``)."""

    client_delays_ms: tuple[float, ...] = option((120.0, 60.0, 20.0, 10.0), lo=0.0, hi=1000.0,
                                                 check=_check_delays,
                                                 doc="one-way delay of each client's access link")
    relay_rate: str = option("1.5mbit", check=bulk.check_rate, doc="every relay's rate")
    #: The shared exit stands for the paper's two exits (OR1's and OR2's paths each had their
    #: own), so by default it may carry both paths: None = ``relay_rate``.
    exit_rate: str | None = option(None, check=bulk.check_rate, doc="the exit's rate (None: relay_rate)")
    #: "link": each relay on its own host behind a ``relay_rate`` link (the queue forms in the
    #: entry's socket, where the paper's detector looks); "bucket": all relays on one unshaped
    #: host, each limited by its token bucket (chive/tor BandwidthRate: the queue forms in the
    #: circuit queues before the connection's buffer, so the detector sees little).
    relay_limit: str = option("link", choices=("link", "bucket"), doc="how relays are held to relay_rate")
    #: ``relay_limit = "link"``: packets the switch's port towards a relay host holds (the
    #: clients' uploads converge there in front of entry1; 100 packets are 0.8 s at 1.5 Mbit/s,
    #: about what a 10/100 switch holds per port; the host side keeps 1000 with TSQ).
    relay_port_packets: int = option(100, lo=1, hi=100_000, doc="switch port buffer towards each relay host")
    upload_bytes: int = option(12_300_000, lo=1024, hi=1024**3, doc="each client's upload")
    latency_bytes: int = option(512, lo=1, hi=65536, doc="the latency probe's response body")
    latency_pause_s: float = option(0.5, lo=0.05, hi=60.0, doc="pause between latency probes")
    capacity_window_s: float = option(5.0, lo=1.0, hi=120.0,
                                      doc="Fig 6: seconds before and after a switch averaged")
    upload_timeout: float = option(900.0, lo=10.0, hi=7200.0, doc="give the uploads this long")
    log_level: str = option("info", check=bulk.check_log_level)
    #: The issue's targets (see .analysis.targets): variant labels and thresholds.
    targets: dict[str, Any] = option(default_factory=dict, doc="variant labels and thresholds")

    @property
    def relay_rate_bytes(self) -> int:
        """``relay_rate`` in bytes per second (the relays' BandwidthRate)."""
        return netns.parse_rate(self.relay_rate) // 8

    def rate_of(self, nick: str) -> str:
        """The rate relay ``nick`` is held to."""
        return (self.exit_rate or self.relay_rate) if nick == EXIT else self.relay_rate


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    impl: str = option("chive", choices=("chive", "tor"), doc="tor: Debian's tor in every role")
    switching: str = option("off", choices=("off", "connection", "path"),
                            doc="chive relays' CircuitSwitching")
    alpha: float = option(0.1, lo=0.0, hi=1.0, doc="SwitchAlpha (fraction of SwitchBufferBytes)")
    beta: float = option(0.5, lo=0.0, hi=1.0, doc="SwitchBeta (fraction of SwitchBufferBytes)")
    conflux: bool = option(False, doc="tor clients: ConfluxEnabled 1 (two legs)")
    spare_path: bool = option(False, doc="clients may use path 2 (entry2, middle2) as well")
    relay: dict[str, Any] = option(default_factory=dict, doc="more chive relay options")
    client: dict[str, Any] = option(default_factory=dict,
                                    doc="more chive client options (e.g. SwitchLighterLeg = 0)")
    params: dict[str, Any] = option(default_factory=dict,
                                    doc="consensus parameters, chive's names (cc_alg = 2: Vegas, "
                                        "stream XON/XOFF instead of the 500-cell stream window)")
    paper: str = option("", doc="the paper's finding for this setting")

    def __post_init__(self) -> None:
        if self.alpha > self.beta:
            raise LabError(f"alpha ({self.alpha}) must not exceed beta ({self.beta})")
        if self.impl == "tor" and (self.switching != "off" or self.relay or self.client):
            raise LabError("tor variants take no chive switching, relay or client options")
        if self.impl == "chive" and self.conflux:
            raise LabError("conflux is tor's (impl = \"tor\")")
        if self.conflux and not self.spare_path:
            raise LabError("conflux needs spare_path = true (its second leg uses entry2, middle2)")


def path_mode_unavailable(binary: Path | None = None) -> str | None:
    """Why chive's ``CircuitSwitching = "path"`` cannot be measured with this binary (None:
    it can): path switching needs the client's ``CircuitSwitching`` option (the spare circuit is
    the client's), which binaries without path switching do not have."""
    from ...network import default_binary

    binary = Path(binary) if binary is not None else default_binary()
    try:
        r = subprocess.run([str(binary), "client", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot ask {binary} about path mode: {e}"
    if not _CLIENT_PATH_OPTION.search(r.stdout + r.stderr):
        return (f"{binary}: the client has no CircuitSwitching option, so this binary has no path "
                "switching (issue 16, branch switch-path); the variant is declared and skipped")
    return None


def client_options(v: VariantOptions) -> dict[str, Any]:
    """A chive client's options beyond its pins: path switching is the client's (its spare circuit
    and its ``switch`` records, hence a MetricsFile)."""
    out: dict[str, Any] = {}
    if v.switching == "path":
        out = {"CircuitSwitching": "path", "MetricsFile": "metrics.jsonl"}
    out.update(v.client)
    return out


def relay_host(p: Params, nick: str) -> str:
    """The host relay ``nick`` runs on."""
    return RELAY_HOSTS[nick] if p.relay_limit == "link" else RELAY_HOST


def relay_options(v: VariantOptions, nick: str) -> dict[str, Any]:
    """A chive relay's options for variant ``v`` (besides the rate and MetricsPort)."""
    out: dict[str, Any] = {"CircuitSwitching": v.switching}
    if v.switching != "off":
        out.update({"SwitchAlpha": v.alpha, "SwitchBeta": v.beta})
    out.update(v.relay)
    if nick != EXIT:
        out["ExitPolicy"] = ["reject *:*"]
    return out


def client_pins(v: VariantOptions) -> dict[str, list[str]]:
    """EntryNodes/MiddleNodes (and ExitNodes for tor) of every client."""
    pins = {"EntryNodes": ["entry1", "entry2"] if v.spare_path else ["entry1"],
            "MiddleNodes": ["middle1", "middle2"] if v.spare_path else ["middle1"]}
    if v.impl == "tor":
        pins["ExitNodes"] = [EXIT]
    return pins


def _perf(ov: Any, client: str, url: str, user: str, timeout: float, extra: list[str]) -> list[str]:
    return [str(ov.binary), "perf", "--socks", ov.addr(client), "--url", url, "--verify",
            "--timeout", f"{timeout:g}", "--socks-user", user, "--label", user, *extra]


def _scrape(tb: netns.Testbed, host: str, url: str) -> str:
    """GET ``url`` from inside ``host`` (a relay's MetricsPort on that host's loopback)."""
    code = ("import sys, urllib.request\n"
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read(1 << 22).decode())")
    r = tb.sh(host, [sys.executable, "-c", code, url], check=False, timeout=20)
    return r.stdout if r.returncode == 0 else ""


def run_repetition_raw(variant: str, v: VariantOptions, rep: int, out_dir: Path, p: Params, *,
                       chive_bin: Path | None = None, progress=None) -> dict[str, Any]:
    """One repetition of ``variant``: testbed, overlay, four simultaneous uploads with latency
    probes beside them; records into ``out_dir``; return run.json's dict."""
    say = progress or (lambda _m: None)
    hosts = [netns.HostSpec(h, netns.LinkSpec(None, delay_ms=d)) for h, d in zip(CLIENT_HOSTS, p.client_delays_ms)]
    if p.relay_limit == "link":
        hosts += [netns.HostSpec(h, netns.LinkSpec(p.rate_of(nick), queue_at="host",
                                                   switch_port_packets=p.relay_port_packets))
                  for nick, h in RELAY_HOSTS.items()]
    else:
        hosts.append(netns.HostSpec(RELAY_HOST, netns.LinkSpec(None)))
    hosts.append(netns.HostSpec(WEB_HOST, netns.LinkSpec(None)))
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=say)
    tor = v.impl == "tor"
    bucket = p.relay_limit == "bucket"
    info: dict[str, Any] = {"variant": variant, "rep": rep, "impl": v.impl, "relay_rate_Bps": p.relay_rate_bytes,
                            "exit_rate_Bps": netns.parse_rate(p.rate_of(EXIT)) // 8, "relay_limit": p.relay_limit,
                            "upload_bytes": p.upload_bytes, "client_delays_ms": list(p.client_delays_ms),
                            "switching": v.switching, "alpha": v.alpha, "beta": v.beta,
                            "conflux": v.conflux, "spare_path": v.spare_path,
                            "consensus": dict(v.params)}
    with no.netns_repetition(out_dir, tb, v.impl, chive_bin=chive_bin, log_level=p.log_level,
                             progress=say) as run:
        ov = run.ov
        ov.add_authority(WEB_HOST, port=DIR_PORT, params=dict(v.params))
        for i, (nick, port) in enumerate(RELAYS.items()):
            host = relay_host(p, nick)
            rate = netns.parse_rate(p.rate_of(nick)) // 8
            if tor:
                # The same 10 ms refill as chive's bucket (the lab's rule for rate-limited tor).
                torrc = {"BandwidthRate": rate, "BandwidthBurst": rate, "TokenBucketRefillInterval": 10}
                ov.add_relay(host, nick, port=port, torrc=torrc if bucket else None)
            else:
                over = relay_options(v, nick)
                over["MetricsPort"] = f"127.0.0.1:{METRICS_PORT0 + i}"
                ov.add_relay(host, nick, port=port, bandwidth_rate=rate if bucket else None, overrides=over)
        for h in CLIENT_HOSTS:
            if tor:
                ov.add_client(h, f"client{h}", port=SOCKS_PORT, extra=client_pins(v),
                              torrc={"ConfluxEnabled": 1 if v.conflux else 0})
            else:
                ov.add_client(h, f"client{h}", port=SOCKS_PORT, extra={**client_pins(v), **client_options(v)})
        ov.add_httpd(WEB_HOST, "httpd", port=HTTP_PORT)
        ov.start(timeout=150 if tor else 90)
        exit_ = None if tor else EXIT
        up_url = ov.url("httpd", "/upload", exit=exit_)
        lat_url = ov.url("httpd", f"/bytes/{p.latency_bytes}", exit=exit_)
        t0 = time.time() + 1.0
        info["t0"] = t0
        run.write_run(info)
        uploads, probes = [], []
        for h in CLIENT_HOSTS:
            c = f"client{h}"
            delay = f"{max(0.0, t0 - time.time()):.3f}"
            argv = _perf(ov, c, up_url, UPLOAD_USER, p.upload_timeout,
                         ["--count", "1", "--method", "post", "--upload-bytes", str(p.upload_bytes),
                          "--progress", "1", "--start-delay", delay])
            with open(out_dir / f"upload-{h}.jsonl", "wb") as fh, open(out_dir / f"upload-{h}.err", "wb") as fe:
                uploads.append(tb.popen(h, argv, stdout=fh, stderr=fe))
            argv = _perf(ov, c, lat_url, LATENCY_USER, 60.0,
                         ["--count", "0", "--duration", f"{p.upload_timeout:g}", "--pause",
                          f"{p.latency_pause_s:g}", "--start-delay", delay])
            with open(out_dir / f"latency-{h}.jsonl", "wb") as fh, open(out_dir / f"latency-{h}.err", "wb") as fe:
                probes.append(tb.popen(h, argv, stdout=fh, stderr=fe))
        say(f"{KIND_NAME}: {variant}: {len(uploads)} uploads of {p.upload_bytes} bytes")
        deadline = t0 + p.upload_timeout + 30
        while any(u.poll() is None for u in uploads):
            if time.time() > deadline:
                break
            time.sleep(0.5)
        info["uploads_done"] = time.time()
        info["upload_exit"] = [u.poll() for u in uploads]
        for pr in probes + [u for u in uploads if u.poll() is None]:
            pr.terminate()
        for pr in probes + uploads:
            try:
                pr.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pr.kill()
        if not tor:
            for i, nick in enumerate(RELAYS):
                text = _scrape(tb, relay_host(p, nick), f"http://127.0.0.1:{METRICS_PORT0 + i}/metrics")
                (out_dir / "net" / nick / "metrics.prom").write_text(text)
        run.write_run(info)
    return info


class Paper003(no.NetnsKind):
    """See the module documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def __init__(self) -> None:
        #: Binary path -> why it cannot run path switching (None: it can); asked once per binary.
        self._path_reason: dict[str, str | None] = {}

    def path_reason(self, binary: Path | None = None) -> str | None:
        """:func:`path_mode_unavailable` for ``binary`` (default: $CHIVE_BIN or target/release), cached."""
        from ...network import default_binary

        key = str(Path(binary) if binary is not None else default_binary())
        if key not in self._path_reason:
            self._path_reason[key] = path_mode_unavailable(Path(key))
        return self._path_reason[key]

    def preflight(self, scenario: Any) -> None:
        """Refuse tor variants without tor; skip (with the reason) the path variants while the
        binary has no path switching."""
        super().preflight(scenario)
        path = [v.label for v in scenario.variants if v.options.switching == "path"]
        reason = self.path_reason() if path else None  # the default binary; --chive-bin is asked again
        if reason:
            print(f"chive-lab: {KIND_NAME}: skipping {', '.join(path)}: {reason}", file=sys.stderr)

    def run_repetition(self, ctx: RepetitionContext) -> None:
        """Skip (``skipped.json``) a path variant the binary cannot run, before the testbed."""
        reason = self.path_reason(ctx.binary) if ctx.variant.options.switching == "path" else None
        if reason:
            (Path(ctx.run_dir) / "skipped.json").write_text(json.dumps({"variant": ctx.variant.label,
                                                                       "reason": reason}))
            ctx.log(f"{ctx.variant.label}: skipped: {reason}")
            return
        super().run_repetition(ctx)

    def doing(self, scenario: Any, p: Params) -> str:
        return f"4 uploads of {p.upload_bytes} bytes"

    def repetition(self, ctx: RepetitionContext, p: Params, run_dir: Path) -> None:
        run_repetition_raw(ctx.variant.label, ctx.variant.options, ctx.rep, run_dir, p, chive_bin=ctx.binary,
                           progress=ctx.log)

    def analyze(self, out_dir: Path, scenario: Any):
        from .analysis import analyze

        return analyze(Path(out_dir), scenario)

    def pool(self, sources: list[Path], out: Path, **options: Any) -> dict[str, Any]:
        """``chive-lab pool``: several results of one setup (e.g. the main variants and the Fig 4
        sweep run apart) analysed as one batch (:mod:`chive_lab.pooling`)."""
        if options:
            raise LabError(f"pool: kind {KIND_NAME!r} takes no option {sorted(options)[0]}")
        from ...pooling import pool_results
        from .analysis import analyze, variant_reps

        return pool_results(sources, out, KIND_NAME, Params, variant_reps, analyze)

    def describe_run(self, scenario: Any) -> str | None:
        p = self.options_of(scenario)
        delays = "/".join(f"{d:g}" for d in p.client_delays_ms)
        limit = "access links" if p.relay_limit == "link" else "token buckets"
        return (f"4 clients ({delays} ms one-way on their access links) each upload {p.upload_bytes} bytes "
                f"at once through relays held to {p.relay_rate} (the exit {p.rate_of(EXIT)}) by their {limit} (path 1: entry1, middle1, exit; path 2: "
                f"entry2, middle2, exit), with a {p.latency_bytes}-byte latency probe every "
                f"{p.latency_pause_s:g} s beside each upload")


KIND = Paper003()
