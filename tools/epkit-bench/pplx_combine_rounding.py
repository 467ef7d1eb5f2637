#!/usr/bin/env python3
"""Why pplx-kernels' tests/test_all_to_all.py fails 2 of 12 against epkit.pplx (issue 63), on the CPU.

    python3 tools/epkit-bench/pplx_combine_rounding.py

That test (test_all_to_all_4_gpu: world size 4, dp 2, 8 experts, top-3, hidden 512, seed 123) builds
its inputs on the host with a torch.Generator, so they can be rebuilt here exactly (procedure of its
tests/all_to_all_utils.py, RankTestData; written anew). Its reference accumulates in the output dtype
(`ref += x.to(out) * 1.5 * w`, rounded at every step) and compares with torch.testing.assert_close
(fp16: rtol 1e-3, atol 1e-5; bf16: rtol 1.6e-2). The combine outputs are evaluated here under three
arithmetic models, each fp32 operation exactly rounded (float64 holds every product and sum exactly
before the single rounding):

  pplx   out = round_out(fma chain over k = 0..K-1 of w_k * y_k in fp32): its combine kernels
         (internode_combine.cu, intranode_combine.cu: `sum += weight * (float)x`, contracted to fma);
  epkit  per destination rank r: partial_r = round_out(fma chain over that rank's k of w_k * y_k);
         out = round_out(fp32 sum of the partials, in the order of each rank's first k): combine.cu,
         send_partials (acc = fmaf(w, v, acc); Vec8<Tout>::pack(acc)) and recv_partials
         (acc += unpack(partial); Vec8<Tout>::pack(acc));
  fp32   the same with the partials kept in fp32 (no round_out before the sum): the proposed change.

It prints the failing elements of each model for the 12 dtype sets, then, on random data at EP8 top-8,
how often each model's result differs from pplx's single rounding and its largest error in output
ulps. Only torch is needed.
"""

import numpy as np
import torch

E, K, H, MAX_TOKENS, BLOCK = 8, 3, 512, 10, 128
WORLD, DP = 4, 2
GROUPS = WORLD // DP
L = E // WORLD


def rnd(x, dtype):
    """Round float64 values to dtype (RNE) and back to float64."""
    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(dtype).to(torch.float64).numpy()


def f32(x):
    return rnd(x, torch.float32)


def test_inputs(in_dtype):
    """The per-DP-group inputs of pplx's test: (num_tokens, indices, weights, x)."""
    rng = torch.Generator()
    rng.manual_seed(123)
    groups = []
    for _ in range(GROUPS):
        n = int(torch.randint(1, MAX_TOKENS, [1], generator=rng).item())
        idx = torch.empty(n, K, dtype=torch.int32)
        for i in range(n):
            idx[i] = torch.randperm(E, generator=rng)[:K]
        w = torch.rand(n, K, dtype=torch.float32, generator=rng)
        if in_dtype.itemsize == 1:
            xf = torch.rand(n, H, dtype=torch.float32, generator=rng)
            x = ((xf - 0.5) * 400).to(in_dtype)
            torch.rand(n, (H + BLOCK - 1) // BLOCK, dtype=torch.float32, generator=rng)  # scales: same draws
        else:
            x = torch.randn(n, H, dtype=in_dtype, generator=rng)
        groups.append((n, idx.numpy(), w.numpy().astype(np.float64), x))
    return groups


def models(y, w, ranks, out):
    """(pplx, epkit, fp32) outputs [n, H] for expert outputs y [n, K, H] (float64 holding out-dtype
    values), weights w [n, K] (fp32 values), destination ranks [n, K]."""
    n = y.shape[0]
    acc = np.zeros((n, y.shape[2]))
    for k in range(y.shape[1]):
        acc = f32(acc + w[:, k:k + 1] * y[:, k])
    pplx = rnd(acc, out)
    epk, e32 = np.zeros_like(pplx), np.zeros_like(pplx)
    for t in range(n):
        tot, tot32 = np.zeros(y.shape[2]), np.zeros(y.shape[2])
        for r in dict.fromkeys(ranks[t].tolist()):
            a = np.zeros(y.shape[2])
            for k in range(y.shape[1]):
                if ranks[t, k] == r:
                    a = f32(a + w[t, k] * y[t, k])
            tot = f32(tot + rnd(a, out))
            tot32 = f32(tot32 + a)
        epk[t], e32[t] = rnd(tot, out), rnd(tot32, out)
    return pplx, epk, e32


def pplx_test(in_dtype, out_dtype):
    fails = {"pplx": [], "epkit": [], "fp32": []}
    for g, (n, idx, w, x) in enumerate(test_inputs(in_dtype)):
        y1 = rnd(x.to(out_dtype).double().numpy() * 1.5, out_dtype)  # expert_y = expert_x.to(out) * 1.5
        y = np.repeat(y1[:, None, :], K, axis=1)
        ref = np.zeros((n, H))
        for k in range(K):
            ref = rnd(ref + rnd(y1 * w[:, k:k + 1], out_dtype), out_dtype)
        rtol, atol = (1e-3, 1e-5) if out_dtype == torch.float16 else (1.6e-2, 1e-5)
        for name, v in zip(("pplx", "epkit", "fp32"), models(y, w, idx // L, out_dtype)):
            bad = np.abs(v - ref) > atol + rtol * np.abs(ref)
            for t, h in zip(*np.nonzero(bad)):
                fails[name].append(f"group {g} token {t} element {h}: got {v[t, h]:.6f}, reference {ref[t, h]:.6f}, "
                                   f"experts {idx[t].tolist()} on ranks {(idx[t] // L).tolist()}, "
                                   f"weights {[round(float(v_), 7) for v_ in w[t]]}, y {y1[t, h]}")
    return fails


def random_stats(out_dtype, W=8, E_=256, K_=8, n=2000, H_=256, seed=0):
    g = np.random.default_rng(seed)
    y = rnd(g.standard_normal((n, K_, H_)), out_dtype)
    w = f32(g.random((n, K_)))
    ranks = np.stack([g.permutation(E_)[:K_] for _ in range(n)]) // (E_ // W)
    pplx, epk, e32 = models(y, w, ranks, out_dtype)
    exact = (w[:, :, None] * y).sum(1)
    mant = 10 if out_dtype == torch.float16 else 7
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 1e-30))) - mant)
    big = np.abs(exact) > 0.5
    err = lambda v: float((np.abs(v - exact) / ulp)[big].max())  # noqa: E731
    return dict(differs_from_pplx_epkit=float((epk != pplx).mean()), differs_from_pplx_fp32=float((e32 != pplx).mean()),
                max_ulps_pplx=err(pplx), max_ulps_epkit=err(epk), max_ulps_fp32=err(e32))


def main():
    print("pplx-kernels tests/test_all_to_all.py, test_all_to_all_4_gpu (W 4, dp 2), failing elements per model:")
    for ind in (torch.bfloat16, torch.float8_e4m3fn, torch.float16):
        for outd in (torch.float16, torch.bfloat16):
            f = pplx_test(ind, outd)
            print(f"  in {str(ind)[6:]:14s} out {str(outd)[6:]:9s}  pplx {len(f['pplx'])}  epkit {len(f['epkit'])}  "
                  f"epkit with fp32 partials {len(f['fp32'])}")
            for line in f["epkit"]:
                print("    epkit:", line)
    print("random data, EP8 top-8 over 256 experts, 2000 tokens x 256 (|exact| > 0.5 for the ulp errors):")
    for outd in (torch.float16, torch.bfloat16):
        print(f"  out {str(outd)[6:]}: {random_stats(outd)}")


if __name__ == "__main__":
    main()
