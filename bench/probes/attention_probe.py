"""Probe (not product code): 8-bit attention at Ideogram 4's shapes against cuDNN's bf16 SDPA (issue 28's
attention share: 35-38 ms of a ~170 ms step).

    python -m comfyui_ideogram4_int8.bench.probes.attention_probe                   (both tables; ~2 min)
    python -m comfyui_ideogram4_int8.bench.probes.attention_probe --only libraries  (the libraries' table)
    python -m comfyui_ideogram4_int8.bench.probes.attention_probe --only triton     (the Triton variants)

The libraries' table: the attention paths the pack can choose (kernels/attention_choice.py) at 4608 / 4096 tokens
(1024x1024, conditional / unconditional) and 16896 / 16384 (2048x2048), 18 heads of 256, on the choice's probe
inputs (q and k with outlier channels): PyTorch SDPA (cuDNN first), cuDNN's FP8 attention (nvidia-cudnn-frontend;
its e4m3 quantizing pass included, and the cuDNN call alone on inputs quantized beforehand), comfy-kitchen's INT8
attention (whole, and its kernel alone after prequantize_int8_attention). ms per call (CUDA events) and the relative
Frobenius error against float32 attention (worst head); a row whose library is missing says why instead. The FP8
rows' note gives their twin's error (e4m3 q, k, v only), the part the inputs' quantization alone explains.

The Triton table:

One Triton flash-attention kernel in four variants: QK in bf16 or int8 (per-token scales, K smoothed by its mean
over tokens, which softmax ignores), PV in bf16 or fp8 e4m3 (V with a per-channel scale, stored transposed so the
MMA's B operand is K-major; P * 448 to e4m3). Output written in [B, N, H, D]. On the pack's
ComfyUI path cuDNN's output already has that layout (q, k, v are transposed views of the qkv output, and SDPA's
output follows q's strides), so "cudnn (sdpa only)" is the peer; the probe's contiguous q makes "+reshape"
copy. Times are GPU time per call (CUDA events over
repeats); errors are against float64 on two heads of synthetic operands (RMS-normed q/k with biased channels,
peaky attention, one outlier V channel). The quantizing pre-pass runs as torch ops and is timed apart: a product
kernel would fuse it into the q/k norm + RoPE kernel.

Result (bench/results/attention-probe-*-2026-11-27-s21.log, H100 and H200): the best variant, int8 QK with bf16
PV, takes 0.542 ms at 4608 tokens against cuDNN's 0.525 (H100; 0.487 against 0.464 at 4096), before its quantizing
pass; fp8 PV is slower (0.92-1.07 ms) and errs 2.7% against float64. No variant was built into the pack.
"""

import argparse
import functools
import importlib
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...kernels import attention_choice as AC
from ...kernels import attention_fp8_cudnn as A

LOG2E = 1.4426950408889634


@triton.jit
def _attn_kernel(
    q_ptr,
    qs_ptr,
    k_ptr,
    ks_ptr,
    v_ptr,
    vs_ptr,
    o_ptr,
    N,
    H,
    sm_scale,
    sqb,
    sqh,
    sqn,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    svd,
    sob,
    son,
    soh,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    QK8: tl.constexpr,
    PV8: tl.constexpr,
    EVEN: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + b.to(tl.int64) * sqb + h * sqh
    k_base = k_ptr + b.to(tl.int64) * skb + h * skh
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    if EVEN:
        q = tl.load(q_base + offs_m[:, None] * sqn + offs_d[None, :])
    else:
        q = tl.load(q_base + offs_m[:, None] * sqn + offs_d[None, :], mask=offs_m[:, None] < N, other=0)
    if QK8:
        qs = tl.load(qs_ptr + bh * N + offs_m, mask=offs_m < N, other=0.0) * (sm_scale * 1.4426950408889634)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        kn = start + offs_n
        if EVEN:
            kt = tl.load(k_base + kn[None, :] * skn + offs_d[:, None])
        else:
            kt = tl.load(k_base + kn[None, :] * skn + offs_d[:, None], mask=kn[None, :] < N, other=0)
        if QK8:
            ks = tl.load(ks_ptr + bh * N + kn, mask=kn < N, other=0.0)
            s = tl.dot(q, kt).to(tl.float32) * qs[:, None] * ks[None, :]
        else:
            s = tl.dot(q, kt) * (sm_scale * 1.4426950408889634)
        if not EVEN:
            s = tl.where(kn[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if PV8:  # v stored [D, N] per head: load the K-major tile and transpose the view
            if EVEN:
                vt = tl.load(v_base + offs_d[:, None] * svd + kn[None, :] * svn)
            else:
                vt = tl.load(v_base + offs_d[:, None] * svd + kn[None, :] * svn, mask=kn[None, :] < N, other=0.0)
            pv = tl.dot((p * 448.0).to(tl.float8e4nv), tl.trans(vt))
        else:
            if EVEN:
                v = tl.load(v_base + kn[:, None] * svn + offs_d[None, :] * svd)
            else:
                v = tl.load(v_base + kn[:, None] * svn + offs_d[None, :] * svd, mask=kn[:, None] < N, other=0.0)
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    if PV8:
        out = out * (tl.load(vs_ptr + bh * D + offs_d) * (1.0 / 448.0))[None, :]
    o_base = o_ptr + b.to(tl.int64) * sob + h * soh
    tl.store(o_base + offs_m[:, None] * son + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < N)


def quantize(q, k, v, qk8, pv8):
    """(q', qs, k', ks, v', vs) in the kernel's forms (torch ops: an upper bound on a fused pre-pass)."""
    qs = ks = vs = None
    if qk8:
        k = k - k.float().mean(dim=2, keepdim=True).to(k.dtype)  # softmax ignores a per-query constant
        qf, kf = q.float(), k.float()
        qs = qf.abs().amax(-1).clamp_min(1e-12) / 127
        ks = kf.abs().amax(-1).clamp_min(1e-12) / 127
        q = torch.round(qf / qs[..., None]).to(torch.int8)
        k = torch.round(kf / ks[..., None]).to(torch.int8)
        qs, ks = qs.reshape(-1).contiguous(), ks.reshape(-1).contiguous()
    if pv8:
        vf = v.float()
        vs = vf.abs().amax(2).clamp_min(1e-12) / 448  # [B, H, D]
        v = (vf / vs[:, :, None, :]).to(torch.float8_e4m3fn).transpose(-1, -2).contiguous()  # [B, H, D, N]
        vs = vs.reshape(-1).contiguous()
    return q, qs, k, ks, v, vs


def attention(q, k, v, qk8, pv8, cfg, pre=None):
    B, H, N, D = q.shape
    out = torch.empty(B, N, H, D, device=q.device, dtype=q.dtype)
    q2, qs, k2, ks, v2, vs = pre if pre is not None else quantize(q, k, v, qk8, pv8)
    BM, BN, w, st = cfg
    dummy = out
    if pv8:
        svb, svh, svd, svn = v2.stride()
    else:
        svb, svh, svn, svd = v2.stride()
    grid = (triton.cdiv(N, BM), B * H)
    _attn_kernel[grid](
        q2,
        qs if qs is not None else dummy,
        k2,
        ks if ks is not None else dummy,
        v2,
        vs if vs is not None else dummy,
        out,
        N,
        H,
        1.0 / math.sqrt(D),
        *q2.stride()[:3],
        *k2.stride()[:3],
        svb,
        svh,
        svn,
        svd,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        BLOCK_M=BM,
        BLOCK_N=BN,
        D=D,
        QK8=qk8,
        PV8=pv8,
        EVEN=N % BN == 0 and N % BM == 0,
        num_warps=w,
        num_stages=st,
    )
    return out


def _cudnn_reshaped(q, k, v):
    b, h, n, d = q.shape
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, h * d)


def gpu_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def operands(B, H, N, D, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)

    def rmsnormed(bias):
        x = torch.randn(B, H, N, D, device=dev, generator=g)
        x[..., :8] += bias  # a few biased channels (a K mean the smoothing removes)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * (0.8 + 0.6 * torch.rand(D, device=dev, generator=g))

    q = rmsnormed(0.0)
    k = rmsnormed(3.0)
    # peaky attention: each query gets a few keys close to it
    idx = torch.randint(0, N, (B, H, N), device=dev, generator=g)
    k = k + 0.0
    q = q + 1.5 * k.gather(2, idx[..., None].expand(-1, -1, -1, D))
    v = torch.randn(B, H, N, D, device=dev, generator=g)
    v[..., 5] *= 20  # an outlier channel
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def errors(out_bnhd, q, k, v, heads=(0, 7)):
    res = []
    for h in heads:
        qd, kd, vd = q[0, h].double(), k[0, h].double(), v[0, h].double()
        ref = torch.softmax(qd @ kd.T / math.sqrt(q.shape[-1]), -1) @ vd
        got = out_bnhd[0, :, h].double()
        rel = (got - ref).norm() / ref.norm()
        cos = F.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
        res.append((rel.item(), cos.item()))
    return max(r for r, _ in res), min(c for _, c in res)


def triton_table():
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    bests = {}
    for N in (4608, 4096):
        B, H, D = 1, 18, 256
        q, k, v = operands(B, H, N, D, dev)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            t = gpu_ms(functools.partial(_cudnn_reshaped, q, k, v))
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        rel, cos = errors(o, q, k, v)
        flops = 4 * B * H * N * N * D
        rows.append((N, "cudnn bf16 (+reshape)", None, t, flops / t / 1e9, rel, cos))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            t0 = gpu_ms(functools.partial(F.scaled_dot_product_attention, q, k, v))
        rows.append((N, "cudnn bf16 (sdpa only)", None, t0, flops / t0 / 1e9, rel, cos))
        for qk8, pv8 in ((False, False), (True, False), (False, True), (True, True)):
            name = f"triton qk {'int8' if qk8 else 'bf16'} pv {'fp8' if pv8 else 'bf16'}"
            pre = quantize(q, k, v, qk8, pv8)
            tq = gpu_ms(functools.partial(quantize, q, k, v, qk8, pv8), reps=5)
            best = None
            cfgs = (
                (128, 64, 8, 2),
                (128, 64, 8, 3),
                (128, 128, 8, 2),
                (128, 32, 8, 3),
                (64, 64, 4, 3),
                (128, 128, 8, 3),
                (64, 128, 4, 2),
                (128, 64, 4, 2),
                (128, 128, 4, 2),
                (256, 64, 8, 2),
            )
            for cfg in cfgs if N == 4608 else (bests[name],):
                try:
                    o = attention(q, k, v, qk8, pv8, cfg, pre)
                    torch.cuda.synchronize()
                    t = gpu_ms(functools.partial(attention, q, k, v, qk8, pv8, cfg, pre))
                except Exception as exc:  # noqa: BLE001
                    print(f"  {name} {cfg}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    continue
                print(f"  N={N} {name} {cfg}: {t:.3f} ms", flush=True)
                if best is None or t < best[1]:
                    best = (cfg, t, o)
            if best is None:
                continue
            bests[name] = best[0]
            rel, cos = errors(best[2], q, k, v)
            rows.append((N, name, best[0], best[1], flops / best[1] / 1e9, rel, cos, tq))
    print("\nN | variant | cfg | ms/call | TFLOPS | rel err vs f64 | cos | torch quant ms")
    for r in rows:
        print(" | ".join(str(round(x, 5)) if isinstance(x, float) else str(x) for x in r))


LIBRARY_TOKENS = (4608, 4096, 16896, 16384)


def _float32_attention(q, k, v):
    """Head by head: float32 SDPA may take the math kernel, whose [L, L] scores of all heads would not fit."""
    heads = [F.scaled_dot_product_attention(*(t[:, h : h + 1].float() for t in (q, k, v))) for h in range(q.shape[1])]
    return torch.cat(heads, dim=1)


def _kitchen_rows(q, k, v, ref, shape):
    why = AC.KitchenInt8().unavailable(q.device, shape, q.dtype)
    if why:
        return [
            ("comfy-kitchen int8", None, None, None, why),
            ("comfy-kitchen int8 (prequantized)", None, None, None, why),
        ]
    kitchen = importlib.import_module("comfy_kitchen")
    version = AC.kitchen_version()
    out = kitchen.int8_attention(q, k, v)
    rows = [("comfy-kitchen int8", AC.cuda_event_timer(lambda: kitchen.int8_attention(q, k, v)), None,
             AC.worst_head_error(out, ref), f"comfy-kitchen {version}")]  # fmt: skip
    if not all(hasattr(kitchen, f) for f in ("prequantize_int8_attention", "int8_attention_from_prequantized")):
        return [*rows, ("comfy-kitchen int8 (prequantized)", None, None, None,
                        f"comfy-kitchen {version} has no prequantize_int8_attention")]  # fmt: skip
    pre = kitchen.prequantize_int8_attention(q, k, v)
    out = kitchen.int8_attention_from_prequantized(pre)
    ms = AC.cuda_event_timer(lambda: kitchen.int8_attention_from_prequantized(pre))
    quant = AC.cuda_event_timer(lambda: kitchen.prequantize_int8_attention(q, k, v))
    return [*rows, ("comfy-kitchen int8 (prequantized)", ms, quant, AC.worst_head_error(out, ref), "kernel alone")]


def _fp8_rows(q, k, v, ref, shape):
    ok, why = A.available(q.device, shape.head_dim, q.dtype)
    if not ok:
        return [("cuDNN fp8", None, None, None, why), ("cuDNN fp8 (prequantized)", None, None, None, why)]
    twin = AC.worst_head_error(A.attention_reference(q, k, v), ref)
    note = f"twin {twin:.2e}; cuDNN {A.backend_version()}, frontend {A.frontend_version()}"
    try:
        out = A.attention(q, k, v)
    except Exception as exc:  # noqa: BLE001 - the probe reports what cuDNN said
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        return [("cuDNN fp8", None, None, None, why), ("cuDNN fp8 (prequantized)", None, None, None, why)]
    rows = [("cuDNN fp8", AC.cuda_event_timer(lambda: A.attention(q, k, v)), None, AC.worst_head_error(out, ref), note)]
    quantized = [A.quantize_e4m3(t) for t in (q, k, v)]
    o = torch.empty_like(q)
    ms = AC.cuda_event_timer(lambda: A.attention_quantized(*quantized, o))
    quant = AC.cuda_event_timer(lambda: [A.quantize_e4m3(t) for t in (q, k, v)])
    return [*rows, ("cuDNN fp8 (prequantized)", ms, quant, AC.worst_head_error(o, ref), "the cuDNN call alone")]


def _sdpa_row(q, k, v, ref):
    sdpa = AC.CANDIDATES[AC.SDPA]
    out = sdpa.run(q, k, v)
    return (
        "SDPA bf16, cuDNN first",
        AC.cuda_event_timer(lambda: sdpa.run(q, k, v)),
        None,
        AC.worst_head_error(out, ref),
        "",
    )


def library_table():
    dev = torch.device("cuda", torch.cuda.current_device())
    print(torch.__version__, torch.cuda.get_device_name(), "cuDNN (torch)", torch.backends.cudnn.version())
    rows = []
    for tokens in LIBRARY_TOKENS:
        shape = AC.Shape(tokens, 18, 256)
        q, k, v = AC.probe_inputs(dev, shape, torch.bfloat16)
        ref = _float32_attention(q, k, v)
        for section in ([_sdpa_row(q, k, v, ref)], _fp8_rows(q, k, v, ref, shape), _kitchen_rows(q, k, v, ref, shape)):
            rows += [(tokens, *row) for row in section]
        del q, k, v, ref
        torch.cuda.empty_cache()
    print("\ntokens | path | ms/call | quantizing ms (apart) | error vs float32 (worst head) | note")
    for tokens, name, ms, quant, err, note in rows:
        cells = ("-" if x is None else f"{x:.3f}" for x in (ms, quant))
        print(f"{tokens} | {name} | {' | '.join(cells)} | {'-' if err is None else f'{err:.2e}'} | {note}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("libraries", "triton"), help="one table (both without it)")
    only = parser.parse_args().only
    if only in (None, "libraries"):
        library_table()
    if only in (None, "triton"):
        triton_table()


if __name__ == "__main__":
    main()
