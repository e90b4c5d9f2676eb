"""A plan for people: a table of fates with reasons, predicted peaks and time, and two charts
(the schedule as a Gantt chart, partition by partition; memory per tier over the epoch)."""

from __future__ import annotations

import pathlib
from typing import Optional

from jgrind.executed.split import Propagate
from jgrind.plan.cost import Prediction, format_bytes
from jgrind.plan.planner import Plan


def _budget(n: int) -> str:
    return "unlimited" if n >= 1 << 61 else format_bytes(n)


def plan_line(plan: Plan) -> str:
    """The plan in one line: what a run with `auto` prints before it starts."""
    if plan.in_memory:
        return (f"auto plan: the in-memory fast path ({format_bytes(plan.in_memory_bytes)} "
                f"fits the device budget), predicted {plan.epoch_seconds:.3g} s per epoch")
    m = plan.prediction.memory
    devices = len(m.device_peaks)
    # on several devices the budget holds each device: the fullest one's peak, not a sum
    device = (f"{format_bytes(m.device)} on the fullest of {devices} devices" if devices > 1
              else format_bytes(m.peak_device + m.device_working_set))
    line = (f"auto plan: {plan.num_parts} partitions, host cache "
            f"{format_bytes(plan.cache_bytes) if plan.cache_bytes else 'off'}; "
            f"{fate_line(plan)}; predicted "
            f"{plan.epoch_seconds:.3g} s per epoch; peaks: device {device}, host "
            f"{format_bytes(m.peak_host)}, SSD {format_bytes(m.peak_ssd)}")
    if plan.in_memory_bytes:
        line += f" (in memory: {format_bytes(plan.in_memory_bytes)})"
    if plan.storage.lossy:
        line += f"; {storage_line(plan)}"
    return line


def fate_line(plan: Plan) -> str:
    """Where the plan keeps each tensor group, briefly: ``H_0 device 2 + host 6, G_1 ssd,
    the rest on the device``; the blocks kept on the device are named only where a group is
    split between tiers."""
    rows = plan.groups()
    away = [f"{row['tensor']} {row['fate']}" for row in rows
            if row["fate"] not in ("device", "regather")]
    if not away:
        return "every tensor on the device"
    rest = len(away) < sum(row["fate"] != "regather" for row in rows)
    return "fates: " + ", ".join(away) + (", the rest on the device" if rest else "")


def storage_line(plan: Plan) -> str:
    """The plan's storage dtypes and the bytes they save: ``stored as bfloat16: host and SSD
    blocks 1.2 GiB instead of 2.4 GiB (saves 1.2 GiB)``. Device blocks stay float32; ``bytes``
    in the table is every tensor's float32 size, ``stored`` what the plan keeps of it."""
    rows = [row for row in plan.groups() if row["stored"]]
    full = sum(row["bytes"] for row in rows)
    stored = sum(row["stored"] for row in rows)
    return (f"stored as {plan.storage.describe()} in host RAM and on SSD: "
            f"{format_bytes(stored)} kept for {format_bytes(full)} of float32 "
            f"(saves {format_bytes(full - stored)})")


def format_plan(plan: Plan) -> str:
    """The plan as text: what is decided, per tensor group, why, and what it is predicted to
    cost."""
    lines = []
    budgets = (f"device budget {_budget(plan.device_budget)}, host budget "
               f"{_budget(plan.host_budget)}, SSD store "
               f"{plan.directory if plan.directory else 'none'}")
    if plan.in_memory:
        lines += [f"plan: in-memory fast path ({budgets})",
                  f"  everything fits on the device ({format_bytes(plan.in_memory_bytes)} "
                  "estimated peak): one jitted step for the whole model, no partitions, no "
                  "offloading",
                  f"  predicted epoch time: {plan.epoch_seconds:.3f} s"]
        return "\n".join(lines)
    p = plan.prediction
    lines.append(f"plan: {plan.num_parts} partitions, host cache "
                 f"{format_bytes(plan.cache_bytes) if plan.cache_bytes else 'off'} ({budgets})")
    lossy = plan.storage.lossy  # a storage dtype column where some dtype is not float32
    dtype_header = f" {'dtype':<16} {'stored':>11} " if lossy else ""
    header = f"  {'tensor':<7} {'bytes':>11} {dtype_header} {'fate':<26} why"
    lines += ["", header, "  " + "-" * (len(header) + 30)]
    for row in plan.groups():
        dtype = (f" {row['dtype']:<16} {format_bytes(row['stored']) if row['stored'] else '-':>11} "
                 if lossy else "")
        lines.append(f"  {row['tensor']:<7} {format_bytes(row['bytes']):>11} {dtype} "
                     f"{row['fate']:<26} {row['why']}")
    if lossy:
        lines.append(f"  {storage_line(plan)}")
    w = plan.workload
    if w is not None:  # name the inputs of split GCN layers' propagation halves
        split = [l for l, layer in enumerate(w.layers) if isinstance(layer, Propagate)]
        if split:
            lines.append("  (" + ", ".join(f"H_{l}" for l in split) + ": the narrow output "
                         "U = H W of a GCN layer run as transform, then propagation; "
                         "docs/engine.md, \"Node-wise layers\")")
    m = p.memory
    masks = w.mask_bytes() if w is not None else 0
    mask_text = (f", of which output masks {format_bytes(masks)}: ReLU layers' backward skips "
                 "recomputing their output" if masks else "")
    lines += ["", "predicted peak memory per tier:",
              f"  device  {format_bytes(m.peak_device + m.device_working_set):>11}  (blocks "
              f"{format_bytes(m.peak_device)} + one partition's working set "
              f"{format_bytes(m.device_working_set)}{mask_text})",
              f"  host    {format_bytes(m.peak_host):>11}  (blocks and recomputed layers "
              f"{format_bytes(m.peak_host - m.host_cache)} + cache {format_bytes(m.host_cache)})",
              f"  ssd     {format_bytes(m.peak_ssd):>11}",
              "", f"predicted epoch time: {plan.epoch_seconds:.3f} s ({_sweep_form(p)})"]
    lines.append(f"  {'sweep':<13} {'compute s':>10} {'I/O s':>9} {'engine s':>9} "
                 f"{'time s':>9}  moves")
    for s in p.sweeps:
        lines.append(f"  {s.label:<13} {s.compute:>10.4f} {p.io_seconds(s):>9.4f} "
                     f"{s.machinery:>9.4f} {p.sweep_seconds(s):>9.4f}  {'; '.join(s.moves)}")
    if plan.alternatives:
        lines += ["", "candidates considered (predicted s per epoch):"]
        for label, seconds in plan.alternatives[:12]:
            lines.append(f"  {seconds:>10.4f}  {label}")
    lines.append(f"\nplanning took {plan.planning_seconds:.3f} s")
    return "\n".join(lines)


def _sweep_form(p) -> str:
    """How the prediction prices a sweep's compute beside its I/O (`Sweep.seconds`)."""
    engine = any(s.machinery for s in p.sweeps)
    if p.cores is not None and p.cores.compute_on_host:
        if engine:
            return (f"the kernels on all of the host's {p.cores.count} cores, the engine's "
                    "own work e, reads and writes around them: c + max(e, r, w, (e + r + w) "
                    "/ cores)")
        return (f"the kernels on all of the host's {p.cores.count} cores, reads and writes "
                "around them: c + max(r, w, (r + w) / cores)")
    return (f"overlap factor {p.overlap:.2f}, reads beside writes {p.parallel:.2f}"
            + ("; at least the engine's own work e" if engine else ""))


def print_plan(plan: Plan) -> None:
    """Print `format_plan`."""
    print(format_plan(plan))


LANES = ("compute", "reads", "writes")
KIND_COLORS = {"forward": "tab:blue", "recompute": "tab:red", "backward": "tab:orange"}
IO_COLORS = {"reads": "tab:green", "writes": "tab:purple"}
# Outlines only while segments stay wide enough to see between them; with more partitions
# neighbours are told apart by their shade alone.
OUTLINED_PARTS = 32


def draw_schedule(prediction: Prediction, ax) -> dict:
    """Draw `Prediction.schedule` on the matplotlib axes ``ax``: a lane each for compute,
    reads and writes, one segment per partition in every sweep, neighbouring partitions in
    alternating shades, each sweep named above the lanes. Returns the segments drawn:
    ``{(sweep index, lane): collection}``, one path per partition in the schedule's order."""
    from matplotlib.colors import to_rgb

    groups: dict = {}
    for row in prediction.schedule():
        groups.setdefault((row["sweep"], row["lane"]), []).append(row)
    num_parts = max((len(s.partitions) for s in prediction.sweeps), default=0)
    outline = dict(edgecolor="black", linewidth=0.3) if num_parts <= OUTLINED_PARTS else \
        dict(edgecolor="none")
    drawn = {}
    for (i, lane), rows in groups.items():
        if lane == "epoch":
            row, = rows
            ax.axvline(row["start"], color="grey", lw=0.4, ls=":")
            ax.text((row["start"] + row["end"]) / 2, len(LANES) - 0.4, row["label"],
                    ha="center", va="bottom", fontsize=7, rotation=30)
            continue
        base = to_rgb(KIND_COLORS[rows[0]["what"]] if lane == "compute" else IO_COLORS[lane])
        shades = [(*base, 1.0 if k % 2 == 0 else 0.5) for k in range(len(rows))]
        y = LANES.index(lane)
        drawn[(i, lane)] = ax.broken_barh([(r["start"], r["end"] - r["start"]) for r in rows],
                                          (y - 0.4, 0.8), facecolors=shades, **outline)
    ax.set_yticks(range(len(LANES)), LANES)
    ax.set_ylim(-0.6, len(LANES) + 0.6)
    ax.set_xlabel("seconds into the epoch (predicted)")
    return drawn


def plot_plan(plan: Plan, directory: str | pathlib.Path) -> Optional[tuple]:
    """Write ``plan-schedule.png`` (a Gantt chart of the epoch, `draw_schedule`: compute,
    reads and writes per partition in every sweep) and ``plan-memory.png`` (predicted bytes
    per tier over the epoch) to ``directory``. Returns the two paths, or None for the
    in-memory fast path (nothing to schedule)."""
    if plan.in_memory or plan.prediction is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    p = plan.prediction
    fig, ax = plt.subplots(figsize=(11, 3.2))
    draw_schedule(p, ax)
    ax.set_title(f"plan schedule: {plan.num_parts} partitions, predicted "
                 f"{plan.epoch_seconds:.3f} s per epoch")
    colors = {**KIND_COLORS, **IO_COLORS}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    schedule = directory / "plan-schedule.png"
    fig.savefig(schedule, dpi=120)
    plt.close(fig)

    timeline = p.timeline(plan.workload, plan.assignment)
    t = [x[0] for x in timeline]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    # the device's budget holds its blocks and one partition's working set (as the printed
    # peak counts it); the other tiers hold blocks only
    extra = {1: p.memory.device_working_set, 2: 0, 3: 0}
    for i, (name, budget) in enumerate((("device (blocks + working set)", plan.device_budget),
                                        ("host", plan.host_budget), ("ssd", None)), start=1):
        line, = ax.step(t, [(x[i] + extra[i]) / 2**20 for x in timeline], where="post",
                        label=name)
        if budget is not None and budget < 1 << 61:
            ax.axhline(budget / 2**20, color=line.get_color(), ls="--", lw=0.8)
    ax.set_xlabel("seconds into the epoch (predicted)")
    ax.set_ylabel("MiB stored (dashed: budget)")
    ax.set_title("predicted memory per tier")
    ax.legend(fontsize=8)
    fig.tight_layout()
    memory = directory / "plan-memory.png"
    fig.savefig(memory, dpi=120)
    plt.close(fig)
    return schedule, memory


def plot_run_against_plan(rows, directory: str | pathlib.Path,
                          title: str = "") -> pathlib.Path:
    """Write ``run-against-plan.png``: the epoch's sweeps end to end twice, as the plan
    predicted them and as the run measured them (`jgrind.plan.check.sweep_table` rows), so a
    sweep that took longer than priced shows as a longer bar in the lower lane."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 2.4))
    colors = plt.get_cmap("tab10")
    for lane, (name, column) in enumerate((("predicted", 1), ("measured", 2))):
        t = 0.0
        for i, row in enumerate(rows):
            ax.broken_barh([(t, row[column])], (lane - 0.4, 0.8), facecolors=colors(i % 10),
                           edgecolor="white", linewidth=0.5)
            if lane == 0:
                ax.text(t, 1.5, row[0], fontsize=6, rotation=30, va="bottom")
            t += row[column]
    ax.set_yticks([0, 1], ["predicted", "measured"])
    ax.set_ylim(-0.6, 2.6)
    ax.set_xlabel("seconds into the epoch (median of the checked epochs)")
    ax.set_title(title or "the run against its plan")
    fig.tight_layout()
    path = directory / "run-against-plan.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

