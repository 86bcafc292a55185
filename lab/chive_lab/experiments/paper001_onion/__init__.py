"""Paper 001 (Tang & Goldberg, CCS 2010), section "Effects on hidden services", on the netns
testbed: connection set-up to an onion service while bulk downloads load the same relays,
chive with round-robin or EWMA circuit scheduling beside Debian's tor 0.4.9.

The paper's clients fetched a page from an onion service four times per client instance; only
the first fetch of each group built circuits (descriptor, introduction, rendezvous), so it
recorded the connection initialisation of the first fetch (SOCKS request until the stream is
open) and the page download separately (Fig 14). The average first-fetch set-up fell from
19.3 s to 17.1 s (−11.4%) with EWMA on two of the seven hops (the client's and the service's
middle relay).

Testbed (netns backend, root): six hosts, each behind its own access link of ``rate`` with
``delay_ms`` of one-way delay, every relay limited to ``relay_rate`` bytes/s (chive
``BandwidthRate``; tor ``BandwidthRate``/``BandwidthBurst``, 10 ms refill). The limit puts the
queues inside the relays, where a circuit scheduler acts: each exit carries one bulk download,
each entry and middle two, so the middles (and entries) are where cells wait, as in the paper's
two prioritised middles. Without it the web server's own uplink is the narrowest point and the
relays forward what arrives without a queue:

* C: the onion clients (one SOCKS client, ``clients`` fetch loops) and the client-side bulk
  client; S: the onion service (a client with ``HiddenServiceDir``), the web server it
  forwards to (``chive httpd``) and the service-side bulk client;
* G: the entry relays ``entryc`` (the clients') and ``entrys`` (the service's);
* M: the middle relays ``middlec`` and ``middles``; R: ``other_relays`` relays (rendezvous
  points, introduction points, HSDirs and the bulk downloads' exits);
* W: the authority and the bulk downloads' web server.

The onion client pins ``entryc``/``middlec``, the service ``entrys``/``middles`` (tor:
``EntryNodes`` and ``HSLayer2Nodes``, its vanguards-lite second hop; tor refuses a service with a
single ``EntryNodes``, so its service may also take ``entryc``; each tor side excludes the
other side's middle, where a rendezvous or introduction point could not be reached by the
other side, whose pinned second hop it is); ``bulk_loops`` downloads
of ``bulk_bytes`` run back to back through each of the two pairs (exits on R), so every
relay a set-up crosses carries bulk cells in the direction its replies travel.

Each fetch loop runs groups: ``fetches`` fetches of ``page_bytes`` under one fresh SOCKS user
(so the first builds a rendezvous circuit and the others reuse it), ``pause_s`` apart, then
``group_pause_s``, then the next group, from ``warmup`` s until ``duration`` s later. Tor
and chive cache the descriptor after the readiness probe, so their first fetches measure
introduction and rendezvous (chive binaries before the descriptor cache, docs/protocol.md,
fetched it for every new rendezvous, so their first fetches include that fetch too).

Variants (:class:`VariantOptions`): ``impl`` (chive, or tor: Debian's tor in every role),
``scheduler`` (chive: ``rr``/``ewma``) on the relays ``prioritised`` names (``all`` or
``middle``; the others run ``rr``), ``relay`` (more chive relay options), ``client`` (more
chive client options of the onion client and the service, e.g. ``OnionPredictedCircuits``),
``paper``.
The chive variants need the onion service in ``chive client`` (``HiddenServiceDir``); a binary
without it is refused before the run (:meth:`Paper001Onion.preflight`).

Per run: ``onion-<i>.jsonl`` (perf transfer records; ``socks_user`` names the group,
``seq`` 0 is its first fetch), ``bulk-*.jsonl``, ``run.json``, node logs under ``net/``.
Analysis: :mod:`.analysis`.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import netns
from ...errors import LabError, RunFailed
from ...kinds import RepetitionContext
from ...network import default_binary
from ...options import option
from ...tor import MIN_BANDWIDTH_RATE, TOKEN_BUCKET_REFILL_MS
from .. import bulk
from .. import netns_overlay as no

KIND_NAME = "paper001-onion"
HOSTS = ("C", "S", "G", "M", "R", "W")
ENTRIES = {"client": "entryc", "service": "entrys"}
MIDDLES = {"client": "middlec", "service": "middles"}
RELAY_PORT0, OTHER_PORT0 = 9001, 9010
SOCKS_ONION, SOCKS_BULK_C, SOCKS_SERVICE, SOCKS_BULK_S = 9050, 9051, 9052, 9053
HTTP_BULK, HTTP_PAGE, DIR_PORT, VIRTUAL_PORT = 8080, 8081, 7000, 80
SCHEDULERS = ("rr", "ewma")
#: What ``chive client --help`` says when the binary runs onion services.
SERVICE_OPTION = "HiddenServiceDir"


def _check_relay_rate(value: int, path: str) -> int:
    if value and value < MIN_BANDWIDTH_RATE:
        raise LabError(f"{path}: 0 (no limit) or at least {MIN_BANDWIDTH_RATE} bytes/s (tor's minimum)")
    return value


@dataclass(frozen=True)
class Params(bulk.DelayTestbedParams):
    """The scenario's keys of this kind (``scenario.options``)."""

    other_relays: int = option(4, lo=3, hi=12, doc="relays on R (rendezvous, intro, HSDir, exits)")
    relay_rate: int = option(500000, lo=0, hi=10**10, check=_check_relay_rate,
                             doc="every relay's BandwidthRate = BandwidthBurst, bytes/s (0: none)")
    clients: int = option(2, lo=1, hi=16, doc="onion fetch loops running side by side")
    fetches: int = option(4, lo=1, hi=16, doc="fetches per group (only the first builds circuits)")
    page_bytes: int = option(51200, lo=1, hi=16 * 1024 * 1024, doc="size of the page fetched")
    pause_s: float = option(0.5, lo=0.0, hi=600.0, doc="pause between the fetches of a group")
    group_pause_s: float = option(1.0, lo=0.0, hi=600.0, doc="pause between groups")
    bulk_loops: int = option(2, lo=0, hi=16, doc="bulk downloads per side (client, service)")
    bulk_bytes: int = option(16 * 1024 * 1024, lo=1024, hi=10 * 1024**3)
    fetch_timeout: float = option(60.0, lo=5.0, hi=3600.0, doc="one fetch, SOCKS request to last byte")
    service_timeout: float = option(180.0, lo=10.0, hi=3600.0,
                                    doc="until a first fetch through the onion service works")
    log_level: str = option("info", check=bulk.check_log_level)
    #: The issue's targets (series labels, thresholds); see .analysis.targets.
    targets: dict[str, Any] = option(default_factory=dict, doc="series labels and thresholds")
    #: The paper's numbers shown beside ours (rr_mean_s, ewma_mean_s, reduction, note).
    paper_numbers: dict[str, Any] = option(default_factory=dict, doc="the paper's figures")


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    impl: str = option("chive", choices=("chive", "tor"), doc="tor: Debian's tor in every role")
    scheduler: str = option("", choices=("", *SCHEDULERS), doc="chive: the prioritised relays' Scheduler")
    prioritised: str = option("all", choices=("all", "middle"),
                              doc="relays running `scheduler` (the others: rr)")
    relay: dict[str, Any] = option(default_factory=dict, doc="more chive relay options, every relay")
    client: dict[str, Any] = option(default_factory=dict,
                                    doc="more chive client options of the onion client and the service "
                                        "(e.g. OnionPredictedCircuits)")
    paper: str = option("", doc="the paper's finding for this setting")

    def __post_init__(self) -> None:
        if self.impl == "tor" and (self.scheduler or self.relay or self.client or self.prioritised != "all"):
            raise LabError("a tor variant takes no scheduler, prioritised, relay or client keys "
                           "(tor 0.4.9 runs KIST with EWMA, CircuitPriorityHalflife from its consensus)")
        if self.impl == "chive" and not self.scheduler:
            raise LabError("a chive variant needs scheduler = \"rr\" or \"ewma\"")
        if "Scheduler" in self.relay:
            raise LabError("set the scheduler with `scheduler`/`prioritised`, not relay.Scheduler")
        if {"EntryNodes", "MiddleNodes"} & set(self.client):
            raise LabError("the onion client's and service's paths are the testbed's: no client.EntryNodes/MiddleNodes")

    def relay_scheduler(self, nick: str) -> str:
        """The Scheduler of chive relay ``nick`` in this variant."""
        if self.prioritised == "middle" and nick not in MIDDLES.values():
            return "rr"
        return self.scheduler


def other_nick(i: int) -> str:
    """Nickname of relay number ``i`` on host R."""
    return f"relay{i + 1}"


def relay_nicks(p: Params) -> list[str]:
    """Every relay of the testbed, in start order."""
    return [*ENTRIES.values(), *MIDDLES.values(), *(other_nick(i) for i in range(p.other_relays))]


def onion_stem(i: int) -> str:
    """File stem of fetch loop ``i``'s records."""
    return f"onion-{i}"


def chive_service_missing(binary: Path) -> str | None:
    """Why ``binary`` cannot run the chive variants (no onion service in ``chive client``), or
    None when it can."""
    if not binary.is_file():
        return f"chive binary not found: {binary}"
    try:
        r = subprocess.run([str(binary), "client", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{binary} client --help` failed: {e}"
    if SERVICE_OPTION not in r.stdout:
        return (f"{binary} has no onion service in `chive client` (no {SERVICE_OPTION} option; "
                f"issue 19's service role)")
    return None


def _place(ov: Any, v: VariantOptions, p: Params) -> None:
    """Place every node of the variant on ``ov`` (not started)."""
    tor = v.impl == "tor"
    ov.add_authority("W", port=DIR_PORT)
    hosts = {"entryc": "G", "entrys": "G", "middlec": "M", "middles": "M"}
    for i, nick in enumerate(relay_nicks(p)):
        host = hosts.get(nick, "R")
        port = RELAY_PORT0 + i if host != "R" else OTHER_PORT0 + i
        if tor:
            # As the lab's loopback tor relays under a rate limit: a 10 ms refill like chive's.
            limit = {"BandwidthRate": p.relay_rate, "BandwidthBurst": p.relay_rate,
                     "TokenBucketRefillInterval": TOKEN_BUCKET_REFILL_MS} if p.relay_rate else None
            ov.add_relay(host, nick, port=port, torrc=limit)
        else:
            ov.add_relay(host, nick, port=port, bandwidth_rate=p.relay_rate or None,
                         overrides={**v.relay, "Scheduler": v.relay_scheduler(nick)})
    ov.add_httpd("W", "httpd", port=HTTP_BULK)
    ov.add_httpd("S", "page", port=HTTP_PAGE)
    exits = [other_nick(i) for i in range(p.other_relays)]
    for side, host, socks in (("client", "C", SOCKS_BULK_C), ("service", "S", SOCKS_BULK_S)):
        if not p.bulk_loops:
            continue
        pins: dict[str, Any] = {"EntryNodes": [ENTRIES[side]], "MiddleNodes": [MIDDLES[side]]}
        if tor:
            pins["ExitNodes"] = exits
        ov.add_client(host, f"bulk{side[0]}", port=socks, extra=pins)
    if tor:
        for side, host in (("client", "C"), ("service", "S")):
            # tor refuses a single EntryNodes beside an onion service (tor#14917): its service
            # may take either entry (both on G, both carrying bulk cells).
            # With a single HSLayer2Nodes relay, a circuit whose last hop (rendezvous or
            # introduction point, HSDir) is that relay cannot be built ("Failed to find node
            # for hop #2"): a rendezvous point the client picked at the service's middle made
            # the service give up on it, and the run's fetches time out. Each side excludes
            # the other side's middle, so neither picks a point the other cannot reach.
            other = "service" if side == "client" else "client"
            pins = {"EntryNodes": [ENTRIES[side]] if side == "client" else [ENTRIES["service"], ENTRIES["client"]],
                    "ExcludeNodes": [MIDDLES[other]]}
            torrc = {"HSLayer2Nodes": MIDDLES[side]}
            if side == "client":
                ov.add_client(host, "onion", port=SOCKS_ONION, extra=pins, torrc=torrc)
            else:
                ov.add_onion_service(host, "service", httpd="page", port=SOCKS_SERVICE,
                                     virtual_port=VIRTUAL_PORT, extra=pins, torrc=torrc)
    else:
        ov.add_client("C", "onion", port=SOCKS_ONION,
                      extra={**v.client, "EntryNodes": [ENTRIES["client"]], "MiddleNodes": [MIDDLES["client"]]})
        ov.add_onion_service("S", "service", httpd="page", port=SOCKS_SERVICE, virtual_port=VIRTUAL_PORT,
                             extra={**v.client, "EntryNodes": [ENTRIES["service"]],
                                    "MiddleNodes": [MIDDLES["service"]]})


def run_repetition_raw(variant: str, v: VariantOptions, rep: int, out_dir: Path, p: Params, *,
                       measure_s: float, warmup_s: float, chive_bin: Path | None = None,
                       progress=None) -> dict[str, Any]:
    """One repetition of ``variant``: testbed, overlay with its onion service, bulk loops from
    t0, fetch groups from t0 + ``warmup_s`` for ``measure_s``; records into ``out_dir``;
    returns run.json's dict."""
    say = progress or (lambda _m: None)
    tb = bulk.testbed(p, HOSTS, delay_ms=p.delay_ms, chive_bin=chive_bin, progress=say)
    tor = v.impl == "tor"
    end = warmup_s + measure_s
    info: dict[str, Any] = {"variant": variant, "rep": rep, "impl": v.impl, "params": p.__dict__,
                            "schedulers": {} if tor else {n: v.relay_scheduler(n) for n in relay_nicks(p)},
                            "measure_s": measure_s, "warmup_s": warmup_s}
    stop = threading.Event()
    with no.netns_repetition(out_dir, tb, v.impl, chive_bin=chive_bin, log_level=p.log_level,
                             progress=say) as run:
        try:
            ov = run.ov
            _place(ov, v, p)
            ov.start(timeout=120)
            onion = ov.onion_address("service")
            info["onion"] = onion
            t_probe = time.time()
            try:
                ov.wait_onion("onion", f"http://{onion}:{VIRTUAL_PORT}/bytes/1024",
                              time.monotonic() + p.service_timeout)
            except LabError as e:
                # This repetition failed (the service never answered); another may not.
                raise RunFailed(f"onion service {onion} did not answer within {p.service_timeout:g} s: {e}",
                                node="service", log_tail=ov._log_tail(ov.nodes["service"])) from e
            info["service_ready_s"] = time.time() - t_probe
            say(f"{KIND_NAME}: {variant}: {onion} answers after {info['service_ready_s']:.1f} s")
            t0 = time.time() + 1.0
            info["t0"] = t0
            run.write_run(info)
            loops = []
            exits = [other_nick(i) for i in range(p.other_relays)]
            for side in ("client", "service"):
                client = f"bulk{side[0]}"
                for i in range(p.bulk_loops if client in ov.nodes else 0):
                    ex = exits[i % len(exits)]
                    url = ov.url("httpd", f"/bytes/{p.bulk_bytes}") if tor else \
                        ov.url("httpd", f"/bytes/{p.bulk_bytes}", exit=ex)
                    loops.append(no.start_perf_loop(tb, ov, client, url, (t0, t0 + end), end, f"{client}{i}",
                                                    "bulk", None, out_dir / f"bulk-{side}-{i}"))
            url = f"http://{onion}:{VIRTUAL_PORT}/bytes/{p.page_bytes}"
            threads = [threading.Thread(target=_group_loop, name=f"onion-{i}", daemon=True,
                                        args=(tb, ov, url, p, i, t0 + warmup_s, t0 + end, out_dir / onion_stem(i),
                                              stop))
                       for i in range(p.clients)]
            for th in threads:
                th.start()
            say(f"{KIND_NAME}: {variant}: {end:g} s of bulk, fetch groups after {warmup_s:g} s")
            for th in threads:
                th.join(timeout=max(1.0, t0 + end + p.fetches * (p.fetch_timeout + p.pause_s) + 30 - time.time()))
            if any(th.is_alive() for th in threads):
                raise LabError("a fetch loop overran its deadline")
            no.wait_for_loops(loops, [], t0 + end + 5)
        finally:
            # Before the testbed goes down: no fetch loop starts another perf process.
            stop.set()
    return info


def _group_loop(tb: netns.Testbed, ov: Any, url: str, p: Params, index: int, start: float, stop_at: float,
                stem: Path, stop: threading.Event) -> None:
    """Fetch loop ``index``: groups of ``p.fetches`` fetches, each group under a fresh SOCKS user,
    no fetch started after ``stop_at`` (UNIX s); records appended to ``stem``.jsonl."""
    host = ov.nodes["onion"].host
    while time.time() < start and not stop.is_set():
        time.sleep(min(0.2, start - time.time()))
    group = 0
    with open(f"{stem}.jsonl", "ab") as fh, open(f"{stem}.err", "ab") as fe:
        while time.time() < stop_at and not stop.is_set():
            user = f"c{index}g{group}"
            # No fetch of the group starts after stop_at (the load ends then); one running then
            # is completed.
            argv = [str(ov.binary), "perf", "--socks", ov.addr("onion"), "--url", url,
                    "--count", str(p.fetches), "--duration", f"{max(0.1, stop_at - time.time()):.3f}",
                    "--pause", f"{p.pause_s:g}", "--verify",
                    "--timeout", f"{p.fetch_timeout:g}", "--socks-user", user, "--label", "onion"]
            proc = tb.popen(host, argv, stdout=fh, stderr=fe)
            try:
                proc.wait(timeout=p.fetches * (p.fetch_timeout + p.pause_s) + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            group += 1
            stop.wait(p.group_pause_s)


class Paper001Onion(no.NetnsKind):
    """See the module documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def preflight(self, scenario: Any) -> None:
        """Refuse the tor variants without tor, the chive variants without chive's onion
        service (``HiddenServiceDir`` in ``chive client``), naming the variants that can run."""
        super().preflight(scenario)
        labels = [v.label for v in scenario.variants]
        chive = [v.label for v in scenario.variants if v.options.impl == "chive"]
        why = chive_service_missing(default_binary()) if chive else None
        if why:
            rest = [x for x in labels if x not in chive]
            raise LabError(f"{KIND_NAME}: variant(s) {', '.join(chive)} need chive's onion service: {why}"
                           + (f"; run the others with --variants {','.join(rest)}" if rest else ""))

    def doing(self, scenario: Any, p: Params) -> str:
        return f"{scenario.warmup + scenario.duration:g} s of onion fetch groups"

    def repetition(self, ctx: RepetitionContext, p: Params, run_dir: Path) -> None:
        if ctx.variant.options.impl == "chive":
            why = chive_service_missing(Path(ctx.binary))
            if why:
                raise LabError(f"{KIND_NAME}: variant {ctx.variant.label} needs chive's onion service: {why}")
        run_repetition_raw(ctx.variant.label, ctx.variant.options, ctx.rep, run_dir, p,
                           measure_s=ctx.scenario.duration, warmup_s=ctx.scenario.warmup, chive_bin=ctx.binary,
                           progress=ctx.log)

    def analyze(self, out_dir: Path, scenario: Any):
        from .analysis import analyze

        return analyze(Path(out_dir), scenario)

    def describe_run(self, scenario: Any) -> str | None:
        p = self.options_of(scenario)
        return (f"{p.describe_links(HOSTS)}; "
                f"{p.bulk_loops} bulk downloads through the clients' and {p.bulk_loops} through the "
                f"service's entry and middle; {p.clients} loops of groups of {p.fetches} fetches of "
                f"{p.page_bytes} bytes from the onion service for {scenario.duration:g} s after "
                f"{scenario.warmup:g} s")


KIND = Paper001Onion()
