"""The pack's ModelPatcher: ComfyUI's loading decisions, with the weights that do not fit streamed behind compute.

ComfyUI decides how many bytes of a MODEL may sit on the card (``load_models_gpu`` → ``partially_load`` →
``load(lowvram_model_memory=...)``, ``partially_unload`` when another model needs room). Its legacy partial load
then casts every offloaded layer when it is called: the copy stream first waits for all compute queued so far
(``model_management.get_offload_stream``), and the compute waits for the copy, so copies and compute take turns.
That made a step several times the resident one on a 16 GB card emulated with ComfyUI's ``reserve_vram``
(docs/performance.md, "Low VRAM").

Here the same budget is honoured block by block (``ideogram4.streaming``): the blocks that fit stay resident, the
others keep their big weights (int8 stays int8, protected bf16 stays bf16) in pinned host memory and stream through
reused device slots, queued ahead on a copy stream of their own. A streamed block crosses as three pieces in the
order its forward uses them (``streaming.block_pieces``: adaln_modulation + attention, the FFN's fused w1|w3 pair,
w2), through three slots of the largest piece (108 MiB: 2 x 306 MiB of whole-block slots become 3 x 108 MiB per
model, and each byte of slot saved is a byte of weights that stays resident instead of crossing every step). The
streamed layers run the same fused kernels on the slot as a resident layer on its weight (w1|w3 stay one fused
call: they get no hooks), so the latent is the resident run's bit for bit.

* LoRA: a streamed layer's patches are merged once, on the load device, into its host copy (the original is kept in
  ComfyUI's backup and restored on unpatch), so it streams merged and stays INT8, as a resident layer's merge does.
* Two MODELs on one card (Ideogram 4's two branches): ComfyUI gives the first model loaded all it asks for and the
  second the rest, so one pass would stream almost everything and the other nothing. Both hide their copies best
  when each streams its share by size: loaded in one call (``load_together``) each takes it as it loads, and a later
  load that must stream rebalances the pack's other loaded MODELs on the card (the sum ComfyUI allowed is kept).
* Pinned memory goes through ComfyUI's ``pin_memory`` (bounded by its ``MAX_PINNED_MEMORY``); a tensor it will not
  pin streams from pageable memory, labelled as such.
* ``IDEOGRAM4_INT8_STREAM=off`` keeps ComfyUI's own partial load; ``IDEOGRAM4_INT8_STREAM_SLOTS`` sets the slots per
  model (default 3 for pieces, 2 for whole blocks); the experiment ``stream-whole-blocks`` streams whole blocks (A/B).
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref

import comfy.model_management
import comfy.model_patcher
import torch

from ...ideogram4 import graph_replay, host_pages, streaming
from ...kernels import model_notes, settings
from . import host_copies, parking, pin_ahead, stream_pieces, stream_pins, weight_upload
from .budget import NO_LIMIT, unlimited
from .int8_ops import site_label
from .op_coverage import CONTEXT_ONLY
from .stream_pieces import host_data as _host_data
from .stream_pieces import streamable as _streamable
from .stream_pieces import weight_bytes as _weight_bytes
from .stream_pieces import with_host_data as _with_host_data

log = logging.getLogger("comfyui_ideogram4_int8")

WHOLE_BLOCKS = "stream-whole-blocks"  # the experiment that streams whole blocks (A/B measurements)
PASS_ESTIMATE = "pass-estimate"  # pass-estimate=comfyui: keep ComfyUI's doubled-batch estimate (comparisons)
NOTE_KIND = "streaming"
PER_PASS_MARGIN = 64 * 2**20  # bytes: the latent, noise and small tensors allocated between the loads
# of a pass's estimate, left free too at a first load while CUDA graphs are on (load_together): their pool measures
# about one pass's estimate (docs/performance.md, "A prompt change at 16 GB")
GRAPH_SHARE = 1.0
WHOLE_UNLOAD_SHARE = 1 / 4  # of its card bytes: a larger request outside the pack's runs unloads a MODEL whole
# of a budget that MODELs loading together share by size, left free: when they come back parked, a budget a little
# smaller than the first (what ComfyUI offers moves by tens of MiB between prompts) still holds both plans
SHARE_SLACK = 0.02
_ON_DEVICE: weakref.WeakSet = weakref.WeakSet()  # patchers whose model has weights on a device
_TOGETHER: dict[str, list] = {}  # device -> the pack MODELs one load_models_gpu call is loading there (load_together)
_SHARED: dict[str, float] = {}  # device -> the bytes those MODELs share by size, once the call's first load shared
_IN_RUN = [0]  # the pack's sampling runs in progress (one_pass_per_branch)
_GRAPH_POOL_BYTES: dict[str, int] = {}  # device -> the bytes the CUDA graphs' pool held when last released there


def streaming_enabled() -> bool:
    return settings.stream()


def pieces_enabled() -> bool:
    return not settings.flag(WHOLE_BLOCKS)


def slot_count(pieces: bool = False) -> int:
    """Slots per model: 3 for pieces (with 2, a block's w2 copy could start only once its attention piece had run,
    and a block's gate_up copy only once it started: a stall where resident blocks separate streamed ones), 2 for
    whole blocks (one in use, the next one's copy in flight)."""
    return settings.stream_slots() or (3 if pieces else 2)


def _blocks(model) -> list[torch.nn.Module]:
    return list(getattr(model.diffusion_model, "layers", []))


def _host_layers(model) -> list[tuple[str, torch.nn.Module]]:
    """The image-only branch's linears it never runs (``llm_cond_proj``: the unconditional pass has no text; both the
    pack's sampler and ComfyUI's DualModelGuider give it none). Once that model streams they stay on the host: a call
    anyway is cast through ComfyUI (slow, correct)."""
    diffusion_model = model.diffusion_model
    if site_label(diffusion_model) != "unconditional":
        return []
    return [
        (f"diffusion_model.{n}", m)
        for n, m in diffusion_model.named_modules()
        if n.startswith(CONTEXT_ONLY) and getattr(m, "ideogram4_int8", False) and m.weight is not None
    ]


class _ModelStream:
    """The streaming state of one diffusion model: plan, host weights, device views, hooks, streamer."""

    def __init__(self, patcher, device: torch.device, plan: streaming.ResidencyPlan):
        self.device = device
        self.plan = plan
        self.label = site_label(patcher.model.diffusion_model)
        self.hooks = []
        self.device_params: dict[int, list] = {}  # id(slot views) -> the Parameters bound from them
        blocks = _blocks(patcher.model)
        split = plan.pieces > len(plan.streamed)  # as the plan was made (the switch is read once, there)
        pieces = {i: stream_pieces.pieces(blocks[i], split) for i in plan.streamed}
        units = [stream_pieces.unit(i, p, device, self.device_params) for i in plan.streamed for p in pieces[i]]
        self.streamer = streaming.BlockStreamer(units, device, plan.slots, plan.slot_bytes)
        for i in plan.streamed:  # the panel note follows the forward's last streamed piece
            then = self.publish if i == plan.streamed[-1] else None
            self.hooks += streaming.hook_pieces(self.streamer, i, pieces[i], then)

    def note(self) -> str:
        p, s = self.plan, self.streamer.stats
        text = (
            f"low-VRAM streaming: {p.device_bytes / streaming.GIB:.2f} GiB on the card "
            f"({len(p.resident)} blocks resident, {p.streaming()}), "
            f"{p.streamed_bytes / streaming.GIB:.2f} GiB int8/bf16 weights from host memory per forward"
        )
        if s.forwards:
            hidden = "hidden behind compute" if s.hidden else f"not hidden: compute waited {s.wait_ms:.1f} ms"
            text += f"; copies {s.copy_ms:.1f} ms per forward, {hidden}"
        if s.pageable:
            text += f"; {s.pageable} tensors from pageable memory (pinned-memory limit reached)"
        return text

    def publish(self) -> None:
        if self.label:
            model_notes.set_note(self.label, NOTE_KIND, self.note())

    def stop(self) -> None:
        self.streamer.release()
        self.device_params.clear()
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        if self.label:
            model_notes.set_note(self.label, NOTE_KIND, None)


class Ideogram4ModelPatcher(comfy.model_patcher.ModelPatcher):
    """ComfyUI's (legacy) ModelPatcher whose partial loads stream blocks (as pieces) behind compute (module docstring).

    The streaming state lives on the model (``model.ideogram4_stream``), which clones of this patcher share."""

    # -- what streams -------------------------------------------------------------------------------------------------
    def _block_bytes(self) -> list[int]:
        return [sum(_weight_bytes(m) for _, m in _streamable(b)) for b in _blocks(self.model)]

    def _streams_on(self, device) -> bool:
        device = torch.device(device) if device is not None else None
        forced = getattr(self.model, "ideogram4_stream_any_device", False)  # tests: the plan on a CPU
        return (
            device is not None
            and (device.type == "cuda" or forced)
            and streaming_enabled()
            and bool(_blocks(self.model))
        )

    def _host_bytes(self) -> int:
        return sum(_weight_bytes(m) for _, m in _host_layers(self.model))

    def _plan_args(self) -> tuple:
        """(block bytes, fixed bytes, slots, host bytes, piece bytes): what the plan and the minimum are made of."""
        blocks = self._block_bytes()
        pieces = [stream_pieces.piece_bytes(b, pieces_enabled()) for b in _blocks(self.model)]
        slots = slot_count(any(len(p) > 1 for p in pieces))
        return blocks, self.model_size() - sum(blocks), slots, self._host_bytes(), pieces

    def stream_plan(self, budget: float) -> streaming.ResidencyPlan:
        blocks, fixed, slots, host, pieces = self._plan_args()
        return streaming.plan_residency(blocks, fixed, budget, slots, host, pieces)

    def streaming_minimum(self) -> int:
        return streaming.minimum_bytes(*self._plan_args())

    @property
    def stream(self) -> _ModelStream | None:
        return getattr(self.model, "ideogram4_stream", None)

    # -- ComfyUI's interfaces -----------------------------------------------------------------------------------------
    def loaded_size(self):
        """A streaming model needs no more memory to run: ComfyUI must not evict the other branch to "finish" loading
        it on every pass (``LoadedModel.model_memory_required`` = size - loaded_size); a parked one reclaims its room
        itself (``parking``). Its real use on the card is ``model.model_loaded_weight_memory``, which
        ``partially_load`` / ``partially_unload`` and the plan work from."""
        if self.stream is not None or parking.parked_bytes(self):
            return self.model_size()
        return super().loaded_size()

    def current_loaded_device(self):
        if parking.parked_bytes(self):  # counted where it will load again (parking)
            return self.load_device
        return super().current_loaded_device()

    def _load_list(self, *args, **kwargs):
        loading = super()._load_list(*args, **kwargs)
        skip = getattr(self.model, "ideogram4_streamed_modules", None)
        if not skip:
            return loading
        return [x for x in loading if x[-3] not in skip]

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        pin_ahead.adopt(self)  # the weights pinned since the loader, in place of their file pages
        parked = parking.parked_bytes(self)
        parking.unpark(self)
        budget = lowvram_model_memory
        log.debug(
            "ideogram4-int8: load %s on %s: budget %.2f GiB of %.2f, full_load=%s, streaming now=%s",
            site_label(self.model.diffusion_model),
            device_to,
            budget / streaming.GIB,
            self.model_size() / streaming.GIB,
            full_load,
            self.stream is not None,
        )
        streams = self._streams_on(device_to)
        if streams:
            _ON_DEVICE.add(self)
            budget, full_load = self._share_with_pending(device_to, budget, full_load, parked)
        if full_load or not streams or budget <= 0 or unlimited(budget):
            self._to_resident(device_to)
            if full_load or unlimited(budget):  # ComfyUI moves every module (a smaller budget: its own partial load)
                weight_upload.before_load(self, device_to, whole_model=full_load)
            return super().load(device_to, lowvram_model_memory, force_patch_weights, full_load)
        if self.stream is not None and budget >= self.model.model_loaded_weight_memory:
            # a streaming model keeps its plan when offered more (short of a full load): growing on one branch's
            # pass only to be shrunk on the other's moved GBs every pass (measured on an emulated 16 GB card)
            return None
        if not parked or budget < parked:  # a parked MODEL given its bytes back leaves the others' plans alone
            budget += self._rebalance(device_to, budget)
        plan = self.stream_plan(budget)  # InsufficientVRAMError names the minimum
        if not plan.streamed:
            self._to_resident(device_to)
            weight_upload.before_load(self, device_to, whole_model=False)
            return super().load(device_to, lowvram_model_memory=NO_LIMIT, force_patch_weights=force_patch_weights)
        self._apply(device_to, plan)
        return None

    def _loading_with(self, device) -> list:
        """The pack's other MODELs of the ``load_models_gpu`` call loading this one on ``device``."""
        return [p for p in _TOGETHER.get(str(torch.device(device)), ()) if p.model is not self.model]

    def _share_with_pending(self, device, budget: float, full_load: bool, parked: int = 0) -> tuple[float, bool]:
        """(budget, full_load) for this load when the pack's other MODELs of the same ``load_models_gpu`` call
        (``loading_together``) load on ``device`` too: ComfyUI offers the first one all the free memory, so when
        the models together do not fit, each takes its share by size of what the first was offered (the full load
        the next load would shrink again moved gigabytes twice, and pinned them, in the first image). Parked MODELs
        that all fit as they were (``parked``: this one's bytes then) take those bytes again: the same plan, whose
        streamed weights are still pinned (a share by size moved a block from one branch to the other between
        prompts, and its weights were pinned again). A share by size leaves ``SHARE_SLACK`` of the offer free, so a
        later offer a little smaller still fits the parked plans: a plan made again from one block fewer streams
        another spread of blocks (``streaming.spread``), whose weights move and are pinned again."""
        group = self._loading_with(device)
        if budget <= 0 or unlimited(budget) or not group:
            return budget, full_load
        key = str(torch.device(device))
        if key in _SHARED:  # an earlier load of this call took its share: so does this one
            return min(budget, _share_by_size(_SHARED[key], self, [self, *group])), False
        pending = [p for p in group if p.model.model_loaded_weight_memory <= 0]
        if budget >= self.model_size() + sum(p.model_size() for p in pending):
            return budget, full_load
        before = [parking.parked_bytes(p) for p in pending]
        if parked and all(before) and budget >= parked + sum(before):
            return float(parked), False  # the last of them too: more than its bytes would make another plan
        if not pending:
            return budget, full_load
        _SHARED[key] = budget * (1 - SHARE_SLACK)
        return _share_by_size(_SHARED[key], self, [self, *pending]), False

    def _weights_move(self) -> None:
        """ComfyUI is about to move or re-patch this model's weights: CUDA graphs that read them where they are go
        (``nodes/runtime/cuda_graphs.py``), with every graph sharing their pool, and the pool's memory with them."""
        freed = graph_replay.release_graphs_of(getattr(self.model, "diffusion_model", None))
        if freed:
            _GRAPH_POOL_BYTES[str(torch.device(self.load_device))] = freed
            log.debug("ideogram4-int8: CUDA graphs released (%.2f GiB)", freed / streaming.GIB)

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False, whole=True):
        """ComfyUI's request to free ``memory_to_free`` bytes: more blocks stream, or (``whole``, the default: a
        request of ComfyUI's) nothing is freed where unloading the MODEL whole costs less (``_unloads_whole``)."""
        self._weights_move()
        device = self.load_device
        log.debug(
            "ideogram4-int8: partially_unload %s: %.2f GiB asked, %.2f loaded",
            site_label(self.model.diffusion_model),
            memory_to_free / streaming.GIB,
            self.model.model_loaded_weight_memory / streaming.GIB,
        )
        if whole and self._unloads_whole(memory_to_free):
            return 0  # ComfyUI unloads it whole: the card copies are dropped (unpatch_model)
        if not self._streams_on(device) or self.model.model_loaded_weight_memory <= 0:
            return super().partially_unload(device_to, memory_to_free, force_patch_weights)
        before = self.model.model_loaded_weight_memory
        try:
            plan = self.stream_plan(before - memory_to_free)
        except streaming.InsufficientVRAMError:
            return 0  # ComfyUI unloads the whole model instead
        if not plan.streamed:
            return 0
        self._apply(device, plan)
        freed = before - self.model.model_loaded_weight_memory
        log.info(
            "ideogram4-int8: %s unloaded partially to %s (%.2f GiB freed)",
            self.stream.label or "model",
            plan.describe(),
            freed / streaming.GIB,
        )
        return freed

    def _unloads_whole(self, memory_to_free: float) -> bool:
        """Whether a request to free ``memory_to_free`` bytes had better unload this MODEL whole: outside the pack's
        runs (another model needs the room: the text encoder at a prompt change), a large part of it, and every weight
        on the card has its host copy (``host_copies``), so the whole unload copies nothing where a partial one moves
        weights back and pins them (docs/performance.md, "A prompt change at 16 GB")."""
        loaded = self.model.model_loaded_weight_memory
        return (
            not _IN_RUN[0]
            and getattr(self.model, "current_patcher", None) is None  # no sampling run holds it (pre_run..cleanup)
            and not getattr(self, "_loading", False)
            and loaded > 0
            and memory_to_free >= loaded * WHOLE_UNLOAD_SHARE
            and host_copies.covers(self)
        )

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        """ComfyUI's load of a MODEL already on the card; a negative ``extra_memory`` shrinks it through
        ``partially_unload``, which must then free the bytes (only ComfyUI's ``model_unload`` unloads it whole). A
        parked MODEL takes back the room it held, with the pack's other parked MODELs of the same call
        (``parking``): at least a byte, so a card too full for the streaming minimum says so. Offered no limit
        (ComfyUI's full load: ``force_full_load``), each takes all its bytes, not the fewer a streaming plan held."""
        if parking.parked_bytes(self):
            group = [self, *self._loading_with(device_to)]
            full = unlimited(extra_memory)
            want = sum(
                (p.model_size() if full else parking.parked_bytes(p)) + parking.MARGIN
                for p in group
                if parking.parked_bytes(p)
            )
            started, offered = time.perf_counter(), extra_memory
            extra_memory = max(parking.reclaim(device_to, extra_memory, want, _keeps_pack), 1)
            log.debug(
                "ideogram4-int8: parked %s takes %.2f GiB back: offered %s, budget %s (%.2f s)",
                site_label(self.model.diffusion_model),
                want / streaming.GIB,
                _gib(offered),
                _gib(extra_memory),
                time.perf_counter() - started,
            )
        self._loading = True
        try:
            return super().partially_load(device_to, extra_memory, force_patch_weights)
        finally:
            self._loading = False

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        if unpatch_weights and self.stream is not None:
            log.debug("ideogram4-int8: unpatch %s: streaming stops", site_label(self.model.diffusion_model))
        dropped, loaded = 0, self.model.model_loaded_weight_memory
        if unpatch_weights:
            self._weights_move()
            self._stop_stream(release=True)
            to_host = device_to is not None and torch.device(device_to).type == "cpu"
            dropped = host_copies.restore(self) if to_host else 0  # ComfyUI's .to below then copies nothing for these
        out = super().unpatch_model(device_to, unpatch_weights)
        if dropped:
            parking.park(self, loaded)
            log.info(
                "ideogram4-int8: %s unloaded: %.2f GiB of card copies dropped (host copies kept)%s",
                site_label(self.model.diffusion_model) or "model",
                dropped / streaming.GIB,
                f"; parked: its next load takes {parking.parked_bytes(self) / streaming.GIB:.2f} GiB back"
                if parking.parked_bytes(self)
                else "",
            )
        return out

    # -- moving blocks ------------------------------------------------------------------------------------------------
    def _apply(self, device, plan: streaming.ResidencyPlan) -> None:
        """Make ``plan`` true: streamed blocks' weights on the host (LoRA merged), everything else on ``device``."""
        device = torch.device(device)
        if self.stream is not None and self.stream.plan == plan and self.stream.device == device:
            return
        self._weights_move()
        started = time.perf_counter()
        self._pin_clock = [0.0, 0]  # seconds and bytes of pinning in this plan
        file_maps = host_pages.FileMappings() if self._copies_file_pages(device) else None
        with self.use_ejected():
            self._stop_stream()
            blocks = _blocks(self.model)
            streamed = set(plan.streamed)
            for i, block in enumerate(blocks):  # what leaves the card first, so what comes in finds room
                if i in streamed:
                    for name, m in _streamable(block):
                        self._stream_module(f"diffusion_model.layers.{i}.{name}", m, device, file_maps)
            names = {f"diffusion_model.layers.{i}.{n}" for i in streamed for n, _ in _streamable(blocks[i])}
            for key, m in _host_layers(self.model) if plan.host_bytes else ():
                self._stream_module(key, m, device, file_maps)
                m.comfy_cast_weights = True
                names.add(key)
            for i, block in enumerate(blocks):
                if i not in streamed:
                    for name, m in _streamable(block):
                        self._unstream_module(f"diffusion_model.layers.{i}.{name}", m, device)
            self.model.ideogram4_streamed_modules = names
            weight_upload.before_load(self, device, whole_model=False)  # _load_list leaves the streamed ones out
            with stream_pins.BOOKKEEPING:  # ComfyUI's load unpins what it loads whole
                super().load(device, lowvram_model_memory=NO_LIMIT, force_patch_weights=False)  # the rest
            stream = _ModelStream(self, device, plan)
            self.model.ideogram4_stream = stream
            self.model.model_lowvram = True  # ComfyUI offers more memory later (partially_load) instead of skipping
            self.model.model_loaded_weight_memory = plan.device_bytes
            self.model.ideogram4_plan_changes = getattr(self.model, "ideogram4_plan_changes", 0) + 1
            _ON_DEVICE.add(self)
        stream.publish()
        # the seconds say what a new plan cost (weights moved both ways, host copies pinned): a run should pay it once
        log.info(
            "ideogram4-int8: %s %s (applied in %.2f s, of which %.2f s pinned %.2f GiB of host memory)",
            stream.label or "model",
            plan.describe(),
            time.perf_counter() - started,
            self._pin_clock[0],
            self._pin_clock[1] / streaming.GIB,
        )

    def _copies_file_pages(self, device) -> bool:
        """Whether a streamed weight still in its checkpoint's file mapping is copied before it is pinned."""
        return stream_pins.copies_file_pages(device)

    def _stream_module(self, key: str, m, device, file_maps: host_pages.FileMappings | None = None) -> None:
        """``m``'s weight to pinned host memory (LoRA merged on ``device`` first); its small tensors on ``device``."""
        weight_key, bias_key = f"{key}.weight", f"{key}.bias"
        if not getattr(m, "comfy_patched_weights", False):
            if weight_key in self.patches:
                self.patch_weight_to_device(weight_key, device_to=device)
            if m.bias is not None:
                self.patch_weight_to_device(bias_key, device_to=device)
            m.comfy_patched_weights = True
        w = m.weight
        if w.device.type != "cpu" or not _host_data(w).is_pinned():
            host = w if w.device.type == "cpu" else host_copies.host_of(self, weight_key, w)
            host = w.to("cpu") if host is None else host
            data = _host_data(host)
            # the file's pages: a copy is pinned instead (ideogram4/host_pages.py says why), and kept only if it
            # pinned; otherwise the file's pages stay, which the kernel may drop and read again
            mapped = file_maps is not None and not data.is_pinned() and file_maps.holds(data)
            m._parameters["weight"] = torch.nn.Parameter(host, requires_grad=False)  # its card copy goes now
            job = stream_pins.Job(m, weight_key, host, data, mapped)
            self._finish_pin(job, stream_pins.pin(job))
        for name, p in list(m._parameters.items()):
            if name != "weight" and p is not None and p.device != device:
                m._parameters[name] = torch.nn.Parameter(p.data.to(device), requires_grad=False)
        for name, b in list(m._buffers.items()):
            if b is not None and b.device != device:
                m._buffers[name] = b.to(device)

    def _finish_pin(self, job: stream_pins.Job, result: stream_pins.Result) -> None:
        """Record a streamed weight's pin (on ``_apply``'s clock) and keep its host copy: the pinned copy of a file's
        pages replaces them; a copy that did not pin is dropped."""
        host = job.host
        if result.pinned:
            if job.mapped:
                host = _with_host_data(host, result.pinning)
                job.module._parameters["weight"] = torch.nn.Parameter(host, requires_grad=False)
            self._pinned().append(result.pinning)
            self._pin_clock[0] += result.seconds
            self._pin_clock[1] += result.pinning.nbytes
        host_copies.remember(self, [(job.key, host, _host_data(host))])  # pinned once, for every later plan

    def _unstream_module(self, key: str, m, device) -> None:
        """A formerly streamed ``m`` back on ``device`` as a resident layer (its host copy already merged). Its
        pinned host weight stays, pinned, as the weight's host copy when it is the unpatched weight."""
        w = m.weight
        if w.device.type == "cpu" and getattr(m, "comfy_patched_weights", False):
            weight_key = f"{key}.weight"
            if not host_copies.remember(self, [(weight_key, w, _host_data(w))]):
                self._unpin(_host_data(w))
            m._parameters["weight"] = torch.nn.Parameter(w.to(device), requires_grad=False)
            m.comfy_cast_weights = False

    def _to_resident(self, device) -> None:
        """Streaming ends: streamed layers come back to ``device`` as resident layers."""
        if self.stream is not None:
            self._weights_move()
            self._stop_stream(move_to=device)

    def _stop_stream(self, move_to=None, release: bool = False) -> None:
        """Remove the hooks and slots. ``move_to``: bring the streamed weights to that device; ``release``: unpin
        every host tensor the model no longer keeps (a LoRA-merged one ComfyUI drops for its backup; all of them under
        ``host-copies=off``); the kept host copies stay pinned for the next plan (unpinned when the model is
        collected); neither: they all stay pinned for the next plan."""
        stream = self.stream
        if stream is not None:
            stream.stop()
            self.model.ideogram4_stream = None
            names = getattr(self.model, "ideogram4_streamed_modules", None) or set()
            self.model.ideogram4_streamed_modules = None
            modules = dict(self.model.named_modules())
            for name in names:
                m = modules.get(name)
                if m is not None and move_to is not None and torch.device(move_to).type != "cpu":
                    self._unstream_module(name, m, move_to)
                elif m is not None:
                    m.comfy_cast_weights = False
        if release:
            kept = host_copies.kept_data(self)
            pinned = self._pinned()
            stream_pins.unpin(pinned, [t for t in pinned if t.data_ptr() not in kept])
            _ON_DEVICE.discard(self)

    def _pinned(self) -> list:
        """The host tensors this model pinned; they are unpinned when the model is collected, loaded or not."""
        if not hasattr(self.model, "ideogram4_pinned"):
            pinned = self.model.ideogram4_pinned = []
            finalizer = weakref.finalize(self.model, _unpin_all, pinned)
            finalizer.atexit = False  # at exit the process's pinned memory goes with it
        return self.model.ideogram4_pinned

    def _unpin(self, data: torch.Tensor) -> None:
        pinned = self._pinned()
        stream_pins.unpin(pinned, [t for t in pinned if t is data])

    def _rebalance(self, device, budget: float) -> float:
        """Shrink the pack's other MODELs on ``device`` to their share of the memory they and this load were given;
        returns the bytes freed for this load."""
        others = [
            p
            for p in list(_ON_DEVICE)
            if p.model is not self.model
            and p.load_device == self.load_device
            and p.model.model_loaded_weight_memory > 0
            and p._streams_on(device)
        ]
        if not others:
            return 0
        pool = budget + sum(p.model.model_loaded_weight_memory for p in others)
        freed = 0
        for p in others:
            share = _share_by_size(pool, p, [self, *others])
            if p.model.model_loaded_weight_memory > share:
                freed += p.partially_unload(p.offload_device, p.model.model_loaded_weight_memory - share, whole=False)
        return freed

    def detach(self, unpatch_all=True):
        if unpatch_all:
            self._weights_move()
        out = super().detach(unpatch_all)
        if unpatch_all:
            _ON_DEVICE.discard(self)
        return out


def _unpin_all(pinned: list) -> None:
    """A collected model's pinned host tensors go back to pageable memory (in turn with the pack's other calls into
    ComfyUI's pin book: ``stream_pins.BOOKKEEPING``; a collection can run on any thread)."""
    stream_pins.unpin(pinned, pinned)


def _gib(budget: float) -> str:
    return "no limit" if unlimited(budget) else f"{budget / streaming.GIB:.2f} GiB"


def _keeps_pack(loaded_model) -> bool:
    """ComfyUI's loaded-model entries a parked load's room never comes from: the pack's MODELs of the same
    ``load_models_gpu`` call (``loading_together``) or held by a sampling run (the other branch: ``_rebalance``
    shares the card with it). Another pack MODEL (another loader's, idle) ComfyUI unloads like any model, as its
    request for the parked MODEL's bytes did before parking: kept, it held its card bytes while the parked load
    streamed more, or stopped at the streaming minimum."""
    patcher = loaded_model.model
    if not isinstance(patcher, Ideogram4ModelPatcher):
        return False
    if getattr(patcher.model, "current_patcher", None) is not None:
        return True
    return any(p.model is patcher.model for pack in _TOGETHER.values() for p in pack)


def _share_by_size(total: float, patcher, patchers) -> float:
    """``patcher``'s part of ``total`` bytes shared by ``patchers`` in proportion to their sizes (both branches hide
    their copies best when each streams its share)."""
    return total * patcher.model_size() / sum(p.model_size() for p in patchers)


def _pack_models(models) -> list:
    """The pack's MODELs among ``models``, each once, in order."""
    return [m for m in dict.fromkeys(models) if isinstance(m, Ideogram4ModelPatcher)]


@contextlib.contextmanager
def one_pass_per_branch(models):
    """While the pack's sampler runs, ComfyUI's memory estimate for a pack MODEL is that of the pass it runs.

    ComfyUI's ``sampler_helpers.estimate_memory`` asks a model for a doubled batch, because a single-model CFG runs
    the conditional and unconditional rows in one batch. The pack's sampler runs each branch MODEL on its own pass
    alone (batch = the latent's), so half of each request was never used; on a card that must stream, that half
    (0.93 GiB at 1024², 3.7 GiB at 2048², from ComfyUI's factor) is weights that crossed the bus every pass instead.
    The per-sample factor (``memory_usage_factor``) is halved for the run and restored after, so every request
    ComfyUI makes during it (``load_together``'s too) equals ComfyUI's own one-batch estimate. The experiment
    ``pass-estimate=comfyui`` keeps the doubled request (comparisons)."""
    bases = list(dict.fromkeys(m.model for m in _pack_models(models)))
    if settings.experiment(PASS_ESTIMATE) == "comfyui":
        bases = []
    saved = [(b, b.memory_usage_factor) for b in bases]
    for b, factor in saved:
        b.memory_usage_factor = factor / 2
    _IN_RUN[0] += 1
    try:
        yield
    finally:
        _IN_RUN[0] -= 1
        for b, factor in saved:
            b.memory_usage_factor = factor


def load_together(models, noise_shape) -> bool:
    """Load the pack's MODELs of one run in one ``load_models_gpu`` call, before sampling.

    ComfyUI's dual-model guider loads each branch when its pass comes; on a card that holds one branch but not two,
    each request then evicts the other branch whole, and both branches load fully in turn every step
    (docs/performance.md, "Low VRAM"). Loaded together, the second load rebalances the first (``_rebalance``), both
    stream their share, and the per-pass requests find nothing left to load (``loaded_size``).

    The memory left free is what those per-pass requests will insist on (``sampler_helpers.estimate_memory``: the
    model's estimate for a doubled batch, one pass's under ``one_pass_per_branch``, plus ComfyUI's reserve): leaving
    less made the first per-pass request shrink one branch, and the streaming MODELs keep their plan when offered more
    later, so part of a small card stayed idle (docs/performance.md, "Low VRAM").

    With CUDA graphs on, a load of a MODEL not on the card leaves room for the graphs' pool too: what the pool held
    when last released on this card, else ``GRAPH_SHARE`` of the pass's estimate; the later runs' requests do not ask
    for it. Without that room the requests ComfyUI makes at each pass found less free than they ask once the pool
    was taken, and ComfyUI made it up by unloading the first model in its list: a branch (a new plan, both branches'
    graphs captured again), or after a prompt change the text encoder, whose pinned memory goes with it (its next
    encode then pins it all again). A MODEL not on the card yet is parked (``parking.park_fresh``): ComfyUI is asked
    for that room only, and the load takes the MODEL's bytes from the dynamic models' pages. Returns whether it
    loaded."""
    pack = _pack_models(models)
    if len(pack) < 2 or not streaming_enabled() or torch.device(pack[0].load_device).type != "cuda":
        return False
    per_pass = max(m.model.memory_required([noise_shape[0] * 2] + list(noise_shape[1:])) for m in pack)
    first_load = any(m.model.model_loaded_weight_memory <= 0 for m in pack)
    if first_load and settings.cuda_graphs() != "off":
        pool = _GRAPH_POOL_BYTES.get(str(torch.device(pack[0].load_device)), 0)
        per_pass += max(per_pass * GRAPH_SHARE, pool)
    per_pass += PER_PASS_MARGIN
    fresh = [m for m in pack if parking.park_fresh(m)]
    try:
        with loading_together(pack):
            comfy.model_management.load_models_gpu(pack, memory_required=per_pass, minimum_memory_required=per_pass)
    finally:
        for m in fresh:  # a load that failed before reaching it: not on the card, so not counted as loaded
            if m.model.model_loaded_weight_memory <= 0:
                parking.unpark(m)
    return True


@contextlib.contextmanager
def loading_together(models):
    """The pack's MODELs among ``models`` load in one ``load_models_gpu`` call: on a card where they do not all fit,
    each takes its share of the memory as it loads (``Ideogram4ModelPatcher._share_with_pending``)."""
    by_device: dict[str, list] = {}
    for m in _pack_models(models):
        by_device.setdefault(str(torch.device(m.load_device)), []).append(m)
    _TOGETHER.update(by_device)
    try:
        yield
    finally:
        for device in by_device:
            _TOGETHER.pop(device, None)
            _SHARED.pop(device, None)


def streaming_summary(models) -> str:
    """The loader summary's line: how ComfyUI's budget will be met on this card (a prediction from the free memory
    now; the panel shows what happened once sampling ran)."""
    patchers = [m for m in models if isinstance(m, Ideogram4ModelPatcher)]
    if not patchers:
        return "model management: ComfyUI's ModelPatcher"
    head = (
        "model management: ComfyUI decides what stays on the card; blocks that do not fit stream from pinned "
        "host memory behind compute (int8 stays int8, LoRA merged)"
    )
    device = patchers[0].load_device
    if not streaming_enabled():
        return f"model management: ComfyUI's own partial load ({settings.said(settings.STREAM)})"
    if torch.device(device).type != "cuda":
        return f"{head}; on {torch.device(device).type} nothing streams"
    total = sum(p.model_size() for p in patchers)
    free = comfy.model_management.get_free_memory(device) - comfy.model_management.minimum_inference_memory()
    free += sum(p.model.model_loaded_weight_memory for p in patchers)
    minimum = sum(p.streaming_minimum() for p in patchers)
    line = (
        f"{head}. Weights {total / streaming.GIB:.1f} GiB; streaming needs at least "
        f"{minimum / streaming.GIB:.1f} GiB for them"
    )
    if free >= total:
        return f"{line}; this card has room for all of them ({free / streaming.GIB:.1f} GiB free)"
    if free < minimum:
        return f"{line}; this card has {max(free, 0) / streaming.GIB:.1f} GiB free: too little (free VRAM first)"
    plans = [p.stream_plan(free * p.model_size() / total) for p in patchers]
    crossing = sum(x.streamed_bytes for x in plans)
    return (
        f"{line}; with {free / streaming.GIB:.1f} GiB free now, about {crossing / streaming.GIB:.1f} GiB cross "
        "per step (the panel shows the measured copies after sampling)"
    )


def stream_report(model) -> dict | None:
    """The streaming state of a MODEL for the panel and benchmarks (None when nothing streams)."""
    stream = getattr(getattr(model, "model", None), "ideogram4_stream", None)
    if stream is None:
        return None
    p = stream.plan
    return {
        "resident_blocks": len(p.resident),
        "streamed_blocks": len(p.streamed),
        "slots": p.slots,
        "slot_mib": round(p.slot_bytes / 2**20, 3),
        "pieces": p.pieces,  # streamed units per forward (3 per streamed block; 1 each with pieces off)
        "gib_on_card": round(p.device_bytes / streaming.GIB, 3),
        "gib_streamed_per_forward": round(p.streamed_bytes / streaming.GIB, 3),
        **stream.streamer.stats.as_dict(),
    }


__all__ = [
    "Ideogram4ModelPatcher",
    "stream_report",
    "streaming_summary",
    "load_together",
    "loading_together",
    "one_pass_per_branch",
    "streaming_enabled",
    "pieces_enabled",
    "WHOLE_BLOCKS",
    "PASS_ESTIMATE",
]
