"""The experiment kinds (each an :class:`chive_lab.kinds.ExperimentKind`, registered in
:data:`chive_lab.kinds.KINDS`) and what several of them share.

Kinds: :mod:`.overlay` (``overlay``), :mod:`.idle_vs_load` (``idle-vs-load``),
:mod:`.paper002` (``paper002-tcp``), :mod:`.paper002_overlay` (``paper002-overlay``),
:mod:`.client_uplink` (``client-uplink``). Shared: :mod:`.overlay_analysis` (the per-class
transfer analysis of the overlay and idle-vs-load kinds), :mod:`.bulk` (testbed options,
per-second series and their figures of the netns kinds), :mod:`.netns_overlay` (perf loops
and samplers on the netns testbed).
"""
