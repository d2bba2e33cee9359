# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · From one chip to a slice: heads, Ulysses and ring attention over a device mesh, and the model block
#
# Wan 14B has 40 attention heads of 128 over 75,600 video tokens at 720p. The case study's workload
# (10 heads on one v6e) is one quarter of that layer: the same layer on a 4-chip slice, 10 heads per chip.
# This notebook takes the kernels of notebooks 04-09 from one chip to a slice of several:
#
# 1. **Heads**: each device runs its H / N heads on the whole sequence. No communication. But a
#    per-head mask must follow its heads to their device.
# 2. **Ulysses** (DeepSpeed-Ulysses, as maxdiffusion runs Wan): the activations arrive split over the
#    *sequence*. An all-to-all turns [H, L/N, D] into [H/N, L, D], each device runs attention on the
#    whole sequence for its heads, and a second all-to-all turns the output back. That is four
#    all-to-alls per call (q, k, v in, o out).
# 3. **Ring**: the sequence stays split. Each kv shard travels to the devices whose queries see it
#    (`ppermute`), the partial outputs merge by their log-sum-exp, and a sparse mask lets the ring
#    skip the hops that no device needs. Any number of heads works.
# 4. What that traffic costs beside the sparse kernel, at Wan 14B's shape and at a longer clip
#    (61 latent frames, 241 video frames: 219,600 tokens), for heads, Ulysses, the ring and Ulysses x ring, compiled for real slices
#    (v6e 2x2, TPU7x 2x2x1, v6e 4x4) without a TPU.
# 5. The model: a Wan-style block in flax nnx whose self-attention is `stlib.attention_fn`, sharded.
#
# Terms: a **mesh** is an array of devices with named axes (`jax.sharding.Mesh`). A **shard_map**
# runs one function per device on that device's block of each array. `P("x")` (a `PartitionSpec`)
# says which array axis is split over mesh axis "x". An **all-to-all** sends every device one slice
# of its array for each other device. **ICI** is the inter-chip interconnect of a TPU slice.
#
# On a host with fewer than four accelerators (a CPU, or a one-chip TPU host such as a v5e) the
# executed cells run on four CPU devices of this process (`--xla_force_host_platform_device_count=4`,
# set in the next cell before JAX starts). On a TPU host the CPU then becomes the default backend
# (`jax_platform_name`), so that every array, reference and model of those cells lives on the same
# four devices. The mesh logic is the same on any backend. The executed cells run at the small CPU
# grid (`stlib.configs.SMALL_CPU`) on every backend; what the case study's shape costs on real
# slices is compiled for them, deviceless, and read from the committed records.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins
SOLUTIONS = "fill"  # "hide": the exercises run your code (stubs; checks print NOT YET); env STLIB_SOLUTIONS wins

# %%
# Find stlib: importable -> use it; in a clone of the repository -> put the clone on sys.path; neither
# (Colab, a lone download) -> pip install it from STLIB_SOURCE, keeping the runtime's own jax and libtpu.
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

# pip source of stlib (a path, archive URL or git+URL); empty: the environment's STLIB_SOURCE, else the repository
STLIB_SOURCE = ""  # @param {type:"string"}


class StlibSetupError(Exception):  # IPython shows its one sentence, not a traceback
    def _render_traceback_(self):
        return [f"StlibSetupError: {self}"]


if importlib.util.find_spec("stlib") is None:
    repo = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "stlib" / "__init__.py").is_file()), None)
    if repo is not None:
        sys.path.insert(0, str(repo))
    else:
        source = STLIB_SOURCE or os.environ.get("STLIB_SOURCE") or "git+https://github.com/stlib-video/stlib"
        pip = [sys.executable, "-m", "pip", "install", "-q"]
        print(f"installing stlib from {source} (the installed jax and libtpu stay) ...")
        if subprocess.run([*pip, "--no-deps", source], capture_output=True, check=False).returncode:
            raise StlibSetupError(f"could not pip install stlib from {source!r}: set STLIB_SOURCE to a reachable "
                                  "clone, archive or git URL of the repository, or open the notebook inside a clone")
        importlib.invalidate_caches()
        missing = [r for r in importlib.metadata.requires("stlib") if not importlib.util.find_spec(re.split(r"\W", r)[0])]
        if missing:
            subprocess.run([*pip, *missing], check=True)
import stlib

print(f"stlib from {Path(stlib.__file__).parent}; " + ", ".join(
    f"{d} {importlib.metadata.version(d)}" for d in ("jax", "jaxlib", "libtpu") if importlib.util.find_spec(d)))

# %%
# Four host devices for the mesh when no TPU slice is at hand: set before JAX starts its backends
# (importing stlib above started none).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import stlib
from stlib import checks, exercises, masks, notebook, parallel, plotting, ring
from stlib.bench import backward_estimate, block_sweep, collectives, slice_compile, slice_traffic
from stlib.configs import SMALL_CPU

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
N = 4
accelerators = jax.devices()
devices = accelerators if len(accelerators) >= N else jax.devices("cpu")
if len(devices) < N:  # the flag above comes too late once JAX has started
    raise notebook.SetupError(f"{len(devices)} CPU device(s), {N} needed: JAX started before the cell above set "
                              "XLA_FLAGS; restart the kernel and run the notebook from the top")
if devices[0].platform != jax.default_backend():  # fewer than N chips here (a one-chip TPU host): the CPU devices
    jax.config.update("jax_platform_name", "cpu")  # the default backend from here on: arrays and programs on the CPU
    print(f"{len(accelerators)} {accelerators[0].device_kind} here, fewer than {N} devices: the executed cells run on "
          f"{N} CPU devices of this process, the CPU the default backend from here on")
tolerance = notebook.tolerance
TOL = tolerance(jnp.float32)  # float32 on the backend the cells run on (stlib.checks)
mesh = Mesh(np.array(devices[:N]), ("x",))
grid = SMALL_CPU.grid  # on every backend: the model's shape is compiled below, not run
H, L, D = 2 * N, grid.num_tokens, 64  # two heads per device
print(f"mesh {dict(mesh.shape)} over {devices[0].platform} devices; q, k, v [{H}, {L:,}, {D}] "
      f"(grid {grid.shape}); the executed cells run at this small size, the model shape is compiled below")
q, k, v = stlib.random_qkv((H, L, D), jnp.float32, seed=0)

# %% [markdown]
# ## Heads: one shard_map, no communication
#
# Written in view: `local` sees only its device's block. With `in_specs=P("x")` that is
# [H/N, L, D]: two of the eight heads, every token. A head-uniform mask is the same on every
# device, so one program serves all of them.

# %%
band = masks.band(L, L // 8)


def heads_sharded(q, k, v, mask):
    def local(q, k, v):  # [H/N, L, D] on each device
        return stlib.attention(q, k, v, mask, impl="xla")

    return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(q, k, v)


out = jax.jit(heads_sharded, static_argnums=3)(q, k, v, band)
ref = stlib.attention(q, k, v, band, impl="reference")
notebook.passed("head-sharded == one-device reference", checks.scaled_error(out, ref), TOL,
                detail=f"; each device holds {out.addressable_shards[0].data.shape} of {out.shape}")

# %% [markdown]
# ## Ulysses: all-to-all in, attention on the whole sequence, all-to-all out
#
# Now the inputs arrive split over the sequence, `P(None, "x")`: each device holds [H, L/N, D].
# `all_to_all(x, "x", split_axis=0, concat_axis=1, tiled=True)` cuts the heads into N pieces,
# sends piece j to device j, and concatenates what arrives along the sequence. Afterwards each
# device holds [H/N, L, D], exactly what the head-sharded kernel ran on. The way back swaps the two axes.

# %%
def ulysses(q, k, v, mask):
    def local(q, k, v):  # [H, L/N, D] on each device
        q, k, v = (jax.lax.all_to_all(x, "x", 0, 1, tiled=True) for x in (q, k, v))  # -> [H/N, L, D]
        out = stlib.attention(q, k, v, mask, impl="xla")
        return jax.lax.all_to_all(out, "x", 1, 0, tiled=True)  # -> [H, L/N, D]

    return jax.shard_map(local, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"))(q, k, v)


out_u = jax.jit(ulysses, static_argnums=3)(q, k, v, band)
notebook.passed("Ulysses == reference", checks.scaled_error(out_u, ref), TOL,
                detail=f"; each device holds {out_u.addressable_shards[0].data.shape}")
library = stlib.parallel_attention(q, k, v, band, mesh=mesh, axis_name="x", strategy="ulysses")
notebook.passed("stlib.parallel_attention(strategy='ulysses') == the Ulysses in view", checks.scaled_error(library, out_u),
                TOL)

# %% [markdown]
# ## Per-head masks follow their heads
#
# Sparse VideoGen gives each head its own pattern: spatial heads attend within their frame,
# temporal heads to their own position in other frames (notebook 09). With head sharding, device d
# must run *its* heads' masks. A `shard_map` body is one program for every device, and the mask's
# tile tables are built on the host, so `stlib.parallel_attention` gives each **distinct**
# per-device head slice its own branch and lets `lax.switch` on `axis_index("x")` pick it. Devices
# whose slices are equal share a branch, and the kernels compiled are the distinct slices.

# %%
spatial, temporal = masks.spatial(grid, 0), masks.temporal(grid, 1)
kinds = ["spatial", "spatial", "temporal", "temporal"] * (H // 4)
mix = masks.per_head([spatial if kind == "spatial" else temporal for kind in kinds])
branches = parallel.device_branches(mix, None, H, N)
print(f"head kinds {kinds}\n{len(branches.branches)} distinct device slices; device -> branch {branches.branch_of_device}")
tables = [stlib.block_layout(masks.per_head([mix.head(h) for h in branches.heads_of(d)]), 128, 128) for d in range(N)]
fig = plotting.device_tables(tables, f"the tile table each device runs (raster order, 128 x 128 tiles), {H} heads over {N} devices")
plotting.save(fig, cfg.figure("11_device_tables"))

for strategy in ("heads", "ulysses"):  # the ring takes the mask in the tokens' own order: its section below
    got = stlib.parallel_attention(q, k, v, mix, mesh=mesh, axis_name="x", strategy=strategy, grid=grid)
    notebook.passed(f"{strategy:8s} with the per-head mix == one-device video_attention",
                    checks.scaled_error(got, stlib.video_attention(q, k, v, grid, mix, impl="reference")), TOL)

# %% [markdown]
# ### Exercise 1: one branch for every device
#
# With heads laid out as `kinds` above, the devices run two different programs (a spatial pair, a
# temporal pair). Write `head_order(kinds, num_devices)`, a permutation of the heads under which
# every device gets the same kinds in the same order (here one spatial and one temporal head). Then
# all devices run the same branch and one kernel is compiled. (In a model the permutation goes into
# the q, k, v projections' output columns once, so nothing moves at run time.)
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("11.head_order")` prints a solution.
#
# *Hint 1:* device d takes the heads d x H / N ... (d + 1) x H / N of the permuted order.
# *Hint 2:* group the heads by kind, then deal each device its share of every kind in turn.

# %%
@exercises.fill_in("11.head_order")
def head_order(kinds, num_devices):
    # --- your code here: return a list, a permutation of range(len(kinds)) ---
    raise NotImplementedError


def check_order(head_order):
    """The permuted heads run one branch on every device, and attention under them equals the reference."""
    order = list(head_order(kinds, N))
    if sorted(order) != list(range(H)):
        raise exercises.NotYet(f"{order} is not a permutation of range({H})")
    permuted = masks.per_head([mix.head(h) for h in order])
    count = len(parallel.device_branches(permuted, None, H, N).branches)
    if count != 1:
        raise exercises.NotYet(f"the devices still run {count} different head slices")
    qp, kp, vp = (x[jnp.asarray(order)] for x in (q, k, v))
    got = stlib.parallel_attention(qp, kp, vp, permuted, mesh=mesh, axis_name="x", grid=grid)
    err = checks.scaled_error(got, stlib.video_attention(qp, kp, vp, grid, permuted, impl="reference"))
    if not err <= TOL:
        raise exercises.NotYet(f"one branch, but max error {err:.1e}: were q, k, v permuted like the mask?")
    return f"order {order}: one branch on all {N} devices, max error {err:.1e}"


exercises.verify("11.head_order", check_order, head_order)

# %% [markdown]
# ## Gradients flow through both strategies
#
# `shard_map`, `all_to_all` and `lax.switch` are all differentiable. The transpose of an
# all-to-all is the reverse all-to-all. So `jax.grad` of sharded attention equals the gradient on
# one device, here through `impl="xla"` (the Pallas kernels' backward is the training notebook's
# subject).

# %%
cotangent = jax.random.normal(jax.random.key(5), (H, L, D))


def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * cotangent)


def gradient_error(got, want) -> float:
    """The largest ``checks.scaled_error`` of gradients against the one-device ones (each relative to
    its largest entry)."""
    return max(checks.scaled_error(g, w) for g, w in zip(got, want))


want = jax.jit(jax.grad(loss(lambda q, k, v: stlib.video_attention(q, k, v, grid, mix, impl="reference")),
                          argnums=(0, 1, 2)))(q, k, v)
for strategy in ("heads", "ulysses"):
    def sharded(q, k, v, strategy=strategy):
        return stlib.parallel_attention(q, k, v, mix, mesh=mesh, axis_name="x", strategy=strategy, grid=grid)

    got = jax.jit(jax.grad(loss(sharded), argnums=(0, 1, 2)))(q, k, v)
    notebook.passed(f"{strategy:8s} dq, dk, dv == one device", gradient_error(got, want), TOL,
                    detail="; relative to the largest entry")

# %% [markdown]
# ## Ring: the sequence stays split, the kv shards travel
#
# Ulysses needs H divisible by the devices (Wan 14B's 40 heads do not divide over 16), and it holds
# every token of a head on one device. A **ring** keeps q, k, v split over the sequence: device i
# holds tokens [i S, (i + 1) S), S = L / N. On hop `offset` device i attends its queries against
# the kv shard of device (i - offset) mod N, which `jax.lax.ppermute` brings over. Each hop gives
# a partial output over some keys and its log-sum-exp, and the partials merge exactly
# (`stlib.reference.merge_partials`, notebook 06's merge).
#
# The (q shard, kv shard) pair of a hop is a block of the mask (`mask.block_view`). With a local
# video mask most blocks are empty. A hop whose block is empty on every device is never issued: no
# transfer, no kernel. Written in view below with plain-JAX attention per hop, which hops are issued
# is decided on the host from the mask's blocks.

# %%
from stlib.reference import merge_partials, reference_attention_lse

S = L // N


def ring_attention(q, k, v, mask):
    blocks = {off: np.stack([mask.block_view(d * S, (d - off) % N * S, S).to_dense() for d in range(N)])
              for off in range(N)}  # [N devices, (H,) S, S] per hop offset
    issued = [off for off, b in blocks.items() if b.any()]

    def local(q, k, v):  # [H, S, D] on each device
        me = jax.lax.axis_index("x")
        o = jnp.zeros(q.shape, jnp.float32)
        lse = jnp.full((*q.shape[:2], 1), -jnp.inf)
        for off in issued:
            perm = [(j, (j + off) % N) for j in range(N)]  # device j's shard goes to device j + off
            kh, vh = (k, v) if off == 0 else (jax.lax.ppermute(x, "x", perm) for x in (k, v))
            o_h, lse_h = reference_attention_lse(q, kh, vh, jnp.asarray(blocks[off])[me], q.shape[-1] ** -0.5)
            o, lse = merge_partials(o, lse, o_h, lse_h)
        return o.astype(q.dtype)

    sharded = jax.shard_map(local, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"))
    return jax.jit(sharded)(q, k, v), issued  # jit: one program, not every op dispatched on its own


in_view = {}
for name, m in {"the per-head mix": mix, "its spatial heads alone": spatial}.items():
    in_view[name], issued = ring_attention(q, k, v, m)
    notebook.passed(f"ring in view with {name} == one device",
                    checks.scaled_error(in_view[name], stlib.attention(q, k, v, m, impl="reference")), TOL,
                    detail=f"; hops issued {issued} of {list(range(N))}")
library = stlib.parallel_attention(q, k, v, mix, mesh=mesh, axis_name="x", strategy="ring", impl="xla")
notebook.passed("stlib.parallel_attention(strategy='ring') == the ring in view",
                checks.scaled_error(library, in_view["the per-head mix"]), TOL)
got = jax.jit(jax.grad(loss(lambda q, k, v: stlib.parallel_attention(
    q, k, v, mix, mesh=mesh, axis_name="x", strategy="ring", impl="xla")), argnums=(0, 1, 2)))(q, k, v)
notebook.passed("its dq, dk, dv == one device", gradient_error(got, want), TOL, detail="; relative to the largest entry")

panels = {}
for name, m in {"per-head SVG mix": mix, "spatial heads alone": spatial, "band, width L / 8": band}.items():
    hops = ring.ring_hops(m, N)
    panels[name] = (ring.ring_blocks(hops, N), [hop.offset for hop in hops])
fig = plotting.ring_blocks(panels, f"the (q shard, kv shard) blocks a {N}-device ring computes (raster order, "
                                   f"{L:,} tokens, {S:,} per device)")
plotting.save(fig, cfg.figure("11_ring_blocks"))

# %% [markdown]
# The temporal heads see their own position in every frame, so every block of the mix holds some
# pair and the ring issues every hop. The spatial heads alone and the band need the shard itself and
# its neighbours only: hop 2 is skipped, and on hops 1 and 3 the devices at the ends of the sequence
# run no kernel. In the library (`stlib.ring`) each hop runs the tile kernel on that block's own
# tables, devices whose blocks allow the same pairs share one compiled branch, and the backward
# rides the same hops: it asks for the kv shard again (a compiled training step moves k and v once:
# the compiler reuses the forward's transfer), the kernel's own backward gives the hop's dq and dk,
# dv, and dk, dv go back to their owner by the inverse `ppermute`.

# %% [markdown]
# ### Balancing the ring
#
# A skipped hop saves a transfer, but the devices must also do about the same work, or the slowest
# one sets the pace. With a frame-causal mask and the sequence split in runs, device d's queries see
# d + 1 shards, and its own shard only in part (the mask's diagonal): the last device works several
# times as long as the first (the contiguous split's steps printed below). Dealing frames to the devices
# back and forth (a zig-zag: 0, 1, 2, 3, 3, 2, 1, 0) pairs an early frame with a late one on every
# device. `stlib.ring.device_steps` counts each device's kernel steps (non-empty tiles over the hops
# it runs) and `stlib.ring.balanced_order` picks the split whose busiest device runs fewest;
# `parallel_attention(..., shard_order=order)` runs the ring in that order and hands the output back
# in the caller's.

# %%
causal_grid = stlib.VideoGrid(2 * N, 8, 16)  # two frames per device
causal = masks.frame_causal(causal_grid)
frame = causal_grid.tokens_per_frame
order, steps = ring.balanced_order(causal, N, unit=frame, block_q=128, block_kv=128)
for kind, per_device in steps.items():
    print(f"{kind:10s} kernel steps per device {per_device.tolist()}  (busiest / mean {per_device.max() / per_device.mean():.2f})")
print(f"balanced_order picks: {order.name}")
qc, kc, vc = stlib.random_qkv((2, causal_grid.num_tokens, 32), seed=3)
balanced = stlib.parallel_attention(qc, kc, vc, causal, mesh=mesh, axis_name="x", strategy="ring", impl="xla",
                                    shard_order=order)
notebook.passed(f"the ring in {order.name} == one device",
                checks.scaled_error(balanced, stlib.attention(qc, kc, vc, causal, impl="reference")), TOL)

# %% [markdown]
# ## Compiling for a real slice without a TPU
#
# libtpu describes whole slices (`get_topology_desc(platform="tpu", topology_name="v6e:2x2")`), and
# a sharded program compiles for them deviceless (notebook 04 compiled one kernel this way). Each
# device's share of the inputs comes from `memory_analysis()`. The all-to-alls are read from the
# compiled HLO. On a TPU mesh `impl="auto"` resolves to the TPU tile kernel, compiled rather than
# interpreted.

# %%
from jax.experimental import topologies

topology = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
tpu_mesh = Mesh(np.array(topology.devices), ("x",))
small_grid = stlib.VideoGrid(3, 16, 32)
small_mix = masks.per_head([masks.spatial(small_grid, 0)] * 4 + [masks.temporal(small_grid, 1)] * 4)
for strategy, spec in (("heads", P("x", None, None)), ("ulysses", P(None, "x", None))):
    arg = jax.ShapeDtypeStruct((8, small_grid.num_tokens, 128), jnp.bfloat16, sharding=NamedSharding(tpu_mesh, spec))
    compiled = jax.jit(lambda q, k, v, strategy=strategy: stlib.parallel_attention(
        q, k, v, small_mix, mesh=tpu_mesh, axis_name="x", strategy=strategy, grid=small_grid)).lower(arg, arg, arg).compile()
    moved = collectives.all_to_all_bytes(compiled.as_text())
    share = compiled.memory_analysis().argument_size_in_bytes / (3 * 8 * small_grid.num_tokens * 128 * 2)
    print(f"v6e:2x2 {strategy:8s}: each device holds {share:.2f} of q, k, v; {len(moved)} all-to-alls of "
          f"{[f'{b / 1e6:.2f} MB' for b in moved]}")
ring_arg = jax.ShapeDtypeStruct((8, small_grid.num_tokens, 128), jnp.bfloat16,
                                sharding=NamedSharding(tpu_mesh, P(None, "x", None)))
for name, m in {"the spatial heads": masks.spatial(small_grid, 0), "the per-head mix": small_mix}.items():
    text = jax.jit(lambda q, k, v, m=m: stlib.parallel_attention(
        q, k, v, m, mesh=tpu_mesh, axis_name="x", strategy="ring")).lower(ring_arg, ring_arg, ring_arg).compile().as_text()
    ahead, starts = collectives.permutes_ahead(text)
    calls, bodies = collectives.kernel_bodies(text)
    print(f"v6e:2x2 ring with {name}: {len(re.findall(r'collective-permute(?:-start)?[(]', text))} kv-shard "
          f"transfers (collective-permutes) in the compiled program, {ahead} of {starts} started before its "
          f"first kernel; kernels run before the first lands: {collectives.kernels_before_arrival(text)}; "
          f"{calls} kernel calls of {bodies} compiled {'body' if bodies == 1 else 'bodies'}")

# %% [markdown]
# ### Exercise 2: what one all-to-all moves
#
# Before attention a device holds [H, L / N, D] of q (and of k, v); after the all-to-all it holds
# [H / N, L, D]. Write `all_to_all_bytes(num_heads, length, head_dim, num_devices, itemsize)`, the
# bytes per device of one such all-to-all's operand, from the shapes alone. The check compares your
# number with every all-to-all the compiler put in the Ulysses program above (read from its HLO).
#
# *Hint 1:* the operand is one device's share, before or after.
# *Hint 2:* count the elements of the shard you wrote down for hint 1, then their bytes.
# `exercises.show("11.all_to_all_bytes")` prints a solution.

# %%
@exercises.fill_in("11.all_to_all_bytes")
def all_to_all_bytes(num_heads, length, head_dim, num_devices, itemsize):
    # --- your code here: return an int, bytes per device ---
    raise NotImplementedError


def check_bytes(all_to_all_bytes):
    """Your bytes against each all-to-all of the compiled Ulysses program (the loop's last strategy)."""
    mine = all_to_all_bytes(8, small_grid.num_tokens, 128, len(topology.devices), 2)
    if sorted(set(moved)) != [mine]:
        raise exercises.NotYet(f"{mine:,} B, but the compiled all-to-alls move {sorted(set(moved))} B each")
    return f"{mine:,} B per device, as each of the compiled program's {len(moved)} all-to-alls"


exercises.verify("11.all_to_all_bytes", check_bytes, all_to_all_bytes)

# %% [markdown]
# ## At Wan 14B's shape and at a longer clip: the slices and what the traffic costs
#
# `python -m stlib.bench.slice_compile run` compiles 40 heads x 75,600 x 128 bf16 with a routed
# per-head SVG plan (20 spatial, 20 temporal heads at density 0.25) on three slices: v6e 2x2
# (4 chips), TPU7x 2x2x1 (4 chips, 8 TensorCores) and v6e 4x4 (16 chips over 4 hosts). 40 heads do
# not divide over 16 devices, so the 4x4 slice takes a 2-D mesh: a batch of 2 (classifier-free
# guidance) x 8 for heads or sequence, like maxdiffusion's data x context meshes. It compiles heads
# and Ulysses at a longer 720p clip too (61 latent frames, 241 video frames: 219,600 tokens; the
# cases ending in `-1min`, after the one minute these frames make at 4 frames a second, 15 s at
# Wan's 16). The ring, and Ulysses beside a ring of 2 (`ulysses-ring`: the axis split into
# Ulysses x ring, the plan's exact masks riding the ring head by head), are compiled by name
# (`run --only v6e-2x2-ring ...`). A program's compile time follows its distinct kernel bodies,
# not its calls: libtpu compiles a body once however many calls run it (`python -m
# stlib.bench.slice_compile reuse` compiles six calls of one band kernel in about the time of one,
# six bands of different widths in about four times that). At this shape a ring's blocks differ
# from device to device (18,900 tokens a device on 4: the frames fall at a different place in every
# shard), so a ring that compiled a kernel a block compiled a body a block. A ring now runs every
# hop through one kernel a direction (`stlib.ring.shared_kernel`): the ring's blocks stacked as heads
# of one mask with one step plan, each device's rows of the step tables and its block's offsets
# passed to the kernel as data. The backward's kernels walk only the kv rows a block has tiles in, so
# each block's tables are padded to the most rows of any block, the padding rows idle. The cell below lists
# every ring program compiled, older records included: its distinct (hop, device) blocks, its kernel
# calls, its distinct bodies and the seconds it took on this series' 2-core machine. The records are committed; the table reads them.

# %%
from stlib.bench.records import read_records

for record in read_records(cfg.data / "slice_compiles.jsonl"):  # every record, the earlier ones of a case too
    if "ring" in record["strategy"] and record.get("kernel_bodies") is not None:
        bodies = record["kernel_bodies"]
        print(f"{record['case']:24s} {record['direction']:8s}: {record['branches']:2d} distinct blocks, "
              f"{record['kernels_in_program']:2d} kernel calls, "
              f"{bodies:2d} {'body  ' if bodies == 1 else 'bodies'}, compiled in {record['compile_s']:,.0f} s")

# %% [markdown]
# The traffic model: a collective of S bytes per device moves, per chip, its devices' S times the
# share bound for another chip (an all-to-all over n chips: (n - 1) / n; a ring's permute: all of it
# where the neighbour is on another chip, none where the two devices share a TPU7x chip), and
# receives as many. At the chip's ICI bandwidth (both directions together, v6e 800 GB/s, TPU7x
# 1,200 GB/s) that takes 2 x bytes / bandwidth. An all-to-all waits for the kernel and the kernel for
# it; a ring's next hop moves while the current one computes, so its permutes cost only what
# exceeds the kernel. It is a lower bound: it counts each chip's injection bandwidth only, and leaves
# out link contention, latency and routes over several hops. The kernel times are the block sweep's
# static estimates (notebook 08), scaled to the heads' work per device and, at 219,600 tokens, by the
# square of the length (a density's pairs). Every number here is a static estimate or a model. None
# is a measurement.

# %%
rows = slice_traffic.table(slice_compile.read(cfg.data / "slice_compiles.jsonl"),
                           block_sweep.read(cfg.data / "tile_block_sweep.jsonl"),
                           backward_estimate.read(cfg.data / "backward_estimates.jsonl"))
print(slice_traffic.format_table(rows))
fig = plotting.communication_vs_kernel(
    rows, "all-to-alls and ring permutes (model, a lower bound) vs the sparse kernel per device (static estimates)\n"
    "40 heads x 128 bf16; kernel line through the band 0.25 and dense estimates")
plotting.save(fig, cfg.figure("11_ulysses_traffic"))
print("\nthe fastest strategy on a sequence split, per density (modelled ms per call):")
print(slice_traffic.format_fastest(slice_traffic.fastest(rows)))

# %% [markdown]
# Read the tables this way. Heads sharding moves nothing, and each device holds 1 / N of q, k, v
# (the input share column), but its inputs must arrive split over the heads. The other strategies
# take them split over the sequence, as the linear layers of a sequence-parallel DiT block hand them
# over: Ulysses moves four arrays of a device's share (the all-to-all and traffic columns), the ring
# moves k and v once per issued hop past the first (the permutes and hops columns), and Ulysses x
# ring does both over fewer devices each. The temporal heads see their own position in every frame,
# so the ring issues every hop for them: at this plan's mix the ring skips nothing (the spatial heads
# alone skip a hop, as the ring written in view above shows). Modelled on the ICI, every strategy's
# traffic stays below the sparse kernel's estimated time at density 0.25: a small fraction of it
# for heads, Ulysses and Ulysses x ring, about half for the rings of 8 (TPU7x 2x2x1: 3.87 of
# 6.63 ms; v6e 4x4: 3.39 of 7.37 ms), whose 14 permutes move k and v to seven other devices. The
# density column gives where the traffic would match the kernel (the kernel's line through its
# dense and band 0.25 estimates, solved for the traffic): up to 0.135 at 75,600 tokens (TPU7x's ring
# of 8), and at 219,600 tokens 0.0013 for v6e 2x2's ring and 0.0294 for TPU7x's, "none" for
# Ulysses: the kernel's work grows with the square of the length and the traffic only with it. That
# column sets all the traffic, a ring's permutes included, against the kernel, whether or not they
# hide behind it; "none: below the kernel at any density" means the traffic is below the kernel
# line's value at density 0. The last table says which sequence-split strategy the model puts first
# at each density, among the strategies compiled for that slice, length and call (at 219,600 tokens
# Ulysses and, on v6e 2x2 and TPU7x 2x2x1, the ring). On
# v6e 2x2, forward at 75,600 tokens, the ring and Ulysses x ring tie: the ring runs no kernel before
# its first shard lands, so one remote hop's share of its permutes is exposed (next paragraph);
# Ulysses x ring runs one kernel first and hides its ring hop, but its all-to-alls wait for the
# kernel and it for them, and the two exposures come to the same time. On TPU7x 2x2x1 and v6e 4x4,
# forward at 75,600 tokens, Ulysses leads at density 0.05 (tied on TPU7x with Ulysses x ring, whose
# ring stays on one chip's two TensorCores and moves nothing over the ICI) and the ring of 8 from
# 0.1 up: it runs a kernel before its first shard lands, so its permutes hide behind the kernel
# once the kernel takes longer than they do. At 219,600 tokens the ring leads on v6e 2x2 and TPU7x
# at every density. In a training step the ring of 8 leads on TPU7x 2x2x1 and v6e 4x4 from density
# 0.1 up (tied with Ulysses on v6e 4x4 from 0.5), Ulysses below it. On v6e 2x2 Ulysses x ring leads
# at every density, by a hair (49.9 ms at density 0.25, Ulysses 50.7, the ring 51.1): it runs a
# kernel before its ring shard lands, so only its all-to-alls show, while that ring runs none, and
# the exposed share of its permutes (2.9 ms) exceeds Ulysses' seven all-to-alls (2.54 ms). The Ulysses x ring
# training step on v6e 4x4 runs no kernel before the shards of its one remote hop land (k and v
# there, dk and dv back), so in a ring of 2 all of that traffic is exposed. The kernel column is the
# single-chip kernel's estimate scaled to each device's share for every strategy: a ring's shared
# kernel, whose blocks share one step plan (at most 8 patterns, one grain and one grid width in
# the forward; the most rows of any block in the backward), is not estimated on its own, so the
# ring's rows are its best case. From density 0.25 up
# the margins are about a tenth of the call or less, within what a lower bound on the traffic can
# tell apart.
#
# The overlap is the compiler's, and it is not complete. In the small ring programs above every
# transfer starts before the first kernel runs, but no kernel runs before the first shard lands (the
# last number of their lines): the compiler schedules the local hop's kernel, the one that waits for
# nothing, after it. The first remote hop's transfer then has nothing to hide behind. At Wan 14B's
# shape the v6e 2x2 rings and the v6e 4x4 training steps of the ring and of Ulysses x ring do the
# same; the other ring and Ulysses x ring programs run kernels first. The model
# charges one hop's share of the permutes as exposed where a compiled record counts no kernel before
# the first arrival (the "kernels before the first shard lands" and "exposed" columns): in a ring of
# 2 that is all of it. Records compiled before that count was kept show "-" and are taken as
# overlapping, so their rows are the model's best case.
#
# The cases ending in `-train` compile a training step's attention: the forward, then dq, dk, dv from
# an output cotangent sharded as q (`jax.grad`). Ulysses issues seven all-to-alls there, not eight:
# q, k, v and the cotangent in, dq, dk, dv out; the forward's output stays on its device, since the
# step does not return it. A ring moves k and v once (the backward reuses the shards the forward
# brought over) and sends dk and dv home, in f32, on every issued hop past the first. Their kernel
# columns are the tile kernel's forward plus backward estimates (notebook 10,
# `python -m stlib.bench.backward_estimate table`).

# %% [markdown]
# ## The model: a Wan-style block in flax nnx
#
# `stlib.attention_fn(mask, grid=..., mesh=..., axis_name=..., strategy=...)` keeps flax's
# `attention_fn` contract: [batch..., L, H, D] in and out, and every keyword that
# `nnx.MultiHeadAttention` passes is accepted. `stlib.wan.WanBlock` builds Wan's block from flax's own
# modules: adaptive-LayerNorm modulation from the timestep embedding, sparse self-attention through
# stlib, dense cross-attention to text tokens, and a GELU MLP. Below, a sliding-tile mask runs
# Ulysses-sharded over the mesh, checked forward and backward against the same block on one device.

# %%
from stlib.wan import WanBlock

tile_mask = masks.sliding_tile(grid, (1, 4, 16), (1, 1, 3))
dim, batch = 64, 1
sharded_fn = stlib.attention_fn(tile_mask, grid=grid, mesh=mesh, axis_name="x", strategy="ulysses")
one_device_fn = stlib.attention_fn(tile_mask, grid=grid, impl="reference")
blocks = [WanBlock(dim, H, 4 * dim, self_attention_fn=fn, rngs=nnx.Rngs(0)) for fn in (sharded_fn, one_device_fn)]
x = jax.random.normal(jax.random.key(1), (batch, L, dim))
text = jax.random.normal(jax.random.key(2), (batch, 32, dim))
time_embedding = 0.1 * jax.random.normal(jax.random.key(3), (batch, 6, dim))


def block_loss(block):  # the output rides along with the gradient: one compiled program per block gives both
    out = block(x, text, time_embedding)
    return jnp.mean(out**2), out


grads, outs = zip(*[nnx.jit(nnx.grad(block_loss, has_aux=True))(b) for b in blocks])
pairs = list(zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])))
gap = gradient_error(*zip(*pairs))  # each parameter's gradient relative to its largest entry
params = sum(p.size for p in jax.tree.leaves(nnx.state(blocks[0], nnx.Param)))
name = (f"WanBlock ({params:,} parameters, {H} heads, sliding tile {tile_mask.tile} / window {tile_mask.window}) "
        f"Ulysses over {N} devices == one device")
notebook.passed(f"{name}: output", checks.scaled_error(outs[0], outs[1]), TOL)
notebook.passed(f"{name}: parameter gradients", gap, TOL, detail="; relative to the largest entry")

# %% [markdown]
# ## Takeaways
#
# * A slice runs the single-chip kernel unchanged. Heads sharding gives each device H / N heads
#   and needs no communication. Ulysses gets there from sequence-sharded inputs with four all-to-alls.
# * A ring keeps the sequence split and moves kv shards instead. It takes any number of heads, and a
#   sparse mask lets it skip the hops no device needs: the compiled program then holds fewer
#   transfers. A zig-zag split evens out a frame-causal mask's work over the devices.
# * Per-head masks must follow their heads. One SPMD program holds one branch per distinct
#   per-device head slice. Laying heads out so the slices coincide (the exercise) compiles one kernel.
# * At Wan 14B's shape the traffic of every strategy stays below the sparse kernel's estimated time
#   at density 0.25 on v6e and TPU7x (about half of it for the rings of 8, a small fraction for the
#   rest), and at the longer clip a smaller share still. A ring's permutes hide behind its kernel
#   except where the compiler runs no kernel before the first shard lands (the v6e 2x2 rings and the
#   v6e 4x4 training steps of the ring and Ulysses x ring here): then one hop's transfer is exposed. The traffic matches
#   the kernel only below density 0.135 (TPU7x's ring of 8), in the forward and in a training step.
# * A ring compiles one kernel body a direction for all its (hop, device) blocks, their tables and
#   offsets passed as data: TPU7x's ring of 8 (64 blocks) compiled its forward in 190 s and its
#   training step (one forward and one backward body) in 274 s, v6e 2x2's ring of 4 (16 blocks) in
#   162 s and 387 s.
# * `stlib.attention_fn` drops into flax's `MultiHeadAttention`. The block trains (gradients through
#   `impl="xla"` here; the Pallas kernels' backward is the subject of the training notebook).
