"""The other prefill matmul issue 6 names: dequantize to f16, then cuBLAS's f16 GEMM.

Times, on the lent GPU through PyTorch (which calls cuBLAS/cuBLASLt), x @ w.T in f16 with
f32 accumulation for the matrices of the 1.5B's forward pass (a layer's q, k and v launched
together, o, gate and up together, down, and the output), at 128, 512 and 2,048 activation
rows, and the least a dequantization of the Q4_K weights to f16 before each GEMM would add:
its bytes (0.5625 read and 2 written per weight) at the copy bandwidth this script measures.
It also says, per matrix, how many rows of a pass of m rows differ in any bit from the same
rows of a pass of 2,048 (cuBLAS picks its kernel per shape), and times gate and up in bf16.
Each figure is the median of 20 timed calls after 3 warm-up calls, by CUDA events. Our own
kernels' times for the same shapes come from `ROWS=512 tests/gpu/pass-kernels` (mmq/mmt).

    python3 tests/cuda/gemm/bench.py
"""

import statistics

import torch

HIDDEN = 1536
# (name, output rows, columns, launches in a pass)
SHAPES = [
    ("q, k, v", 1536 + 256 + 256, HIDDEN, 28),
    ("o", HIDDEN, HIDDEN, 28),
    ("gate, up", 2 * 8960, HIDDEN, 28),
    ("down", HIDDEN, 8960, 28),
    ("output", 151936, HIDDEN, 1),
]
ROWS = [128, 512, 2048]
Q4_K_BYTES_PER_WEIGHT = 144 / 256


def median_ms(call, repeats=20, warmup=3):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth():
    """Bytes a second of a device-to-device copy of 1 GiB (read plus written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms / 1e3)


def row_bits_by_pass_rows(w):
    """Whether a row's product keeps its bits when the pass has fewer rows, as every matmul of
    ours does: rows of x[:m] @ w.T against the same rows of the 2,048-row product."""
    x = torch.randn(2048, w.shape[1], dtype=torch.float16, device="cuda")
    full = x @ w.T
    changed = []
    for m in (1, 2, 5, 16, 33, 64, 128, 512, 1000):
        part = x[:m] @ w.T
        rows = (part != full[:m]).any(dim=1).sum().item()
        changed.append(f"{m}:{rows}")
    return " ".join(changed)


def main():
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + written)")
    print(f"{'matrix':10} {'rows':>5} {'gemm us':>9} {'TFLOP/s':>8} {'dequant us':>11}")
    totals = {rows: [0.0, 0.0] for rows in ROWS}
    for name, out_rows, cols, launches in SHAPES:
        w = torch.randn(out_rows, cols, dtype=torch.float16, device="cuda") / cols**0.5
        dequant_us = out_rows * cols * (Q4_K_BYTES_PER_WEIGHT + 2) / bandwidth * 1e6
        for rows in ROWS:
            x = torch.randn(rows, cols, dtype=torch.float16, device="cuda")
            ms = median_ms(lambda: x @ w.T)
            tflops = 2 * rows * out_rows * cols / (ms / 1e3) / 1e12
            print(f"{name:10} {rows:5} {ms * 1e3:9.1f} {tflops:8.1f} {dequant_us:11.1f}")
            totals[rows][0] += launches * ms * 1e3
            totals[rows][1] += launches * dequant_us
        print(f"{name:10} rows whose bits differ from the 2,048-row pass, by rows: "
              f"{row_bits_by_pass_rows(w)}")
        if name == "gate, up":
            wb = w.to(torch.bfloat16)
            for rows in ROWS:
                x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
                ms = median_ms(lambda: x @ wb.T)
                print(f"{name:10} {rows:5} {ms * 1e3:9.1f} bf16")
            del wb
        del w
    for rows, (gemm_us, dequant_us) in totals.items():
        print(
            f"a pass of {rows} rows: GEMMs {gemm_us / 1e3:.2f} ms, with dequantization "
            f"{(gemm_us + dequant_us) / 1e3:.2f} ms: at most {rows / (gemm_us / 1e6):,.0f} / "
            f"{rows / ((gemm_us + dequant_us) / 1e6):,.0f} tok/s from the matmuls"
        )


if __name__ == "__main__":
    main()
