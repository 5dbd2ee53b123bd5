"""GPT-2 in plain PyTorch tensors: what the hand-written peers share.

`peer_cudagraph.py` (eager ops, one CUDA graph) and `peer_compile.py`
(torch.compile, one CUDA graph) both run this module's weights, shapes and
reference forward, and check themselves against transformers the same way:

- `model_config(name, model_dir)`: a size preset (gpt2 = 124M, medium, large,
  xl, tiny) or an HF `config.json`.
- `Weights`: GPT-2's parameters as plain tensors in HF's Conv1D layout
  (y = x @ W + b), either GPT-2's init drawn from `torch.manual_seed(seed)` or
  read from an HF directory's `model.safetensors` (keys with or without the
  `transformer.` prefix, as Ember's loader takes them).
- `prefill`: the eager batched prompt forward that writes a KV cache, used as
  peer_cudagraph's timed prefill and as the reference that fills a cache for
  the checks.
- `hf_model` + `compare`: transformers' GPT2LMHeadModel with the same weights
  (loaded from the directory itself when there is one, so a mistake in our
  loader shows) and the fp16-aware tolerance both peers apply.
- `Timer`, `pct`, `csv_ints`, `prefill_shapes`: the timing helpers; the last
  three, like `SIZES`, work without torch (peer_compile.py --stub).
"""

import json
import math
import os
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the helpers at the end (csv_ints, pct, ...) work without torch
    torch = F = None

VOCAB = 50257
N_POSITIONS = 1024
# name -> (n_layer, n_head, n_embd): GPT-2's four published sizes and a smoke model.
SIZES = {
    "gpt2": (12, 12, 768),
    "medium": (24, 16, 1024),
    "large": (36, 20, 1280),
    "xl": (48, 25, 1600),
    "tiny": (2, 4, 128),
}

# Our per-layer names -> HF GPT2LMHeadModel's (under transformer.h.{i}.).
LAYER_NAMES = dict(ln1_w="ln_1.weight", ln1_b="ln_1.bias", attn_w="attn.c_attn.weight",
                   attn_b="attn.c_attn.bias", proj_w="attn.c_proj.weight",
                   proj_b="attn.c_proj.bias", ln2_w="ln_2.weight", ln2_b="ln_2.bias",
                   fc_w="mlp.c_fc.weight", fc_b="mlp.c_fc.bias", fcproj_w="mlp.c_proj.weight",
                   fcproj_b="mlp.c_proj.bias")


def model_config(name="gpt2", model_dir=None):
    """The shape dict every peer uses: a preset by name, or `model_dir`'s config.json."""
    if model_dir:
        with open(os.path.join(model_dir, "config.json")) as f:
            hf = json.load(f)
        return dict(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                    vocab=hf["vocab_size"], n_positions=hf["n_positions"],
                    eps=hf.get("layer_norm_epsilon", 1e-5), name=os.path.basename(
                        os.path.normpath(model_dir)))
    n_layer, n_head, n_embd = SIZES[name]
    return dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab=VOCAB,
                n_positions=N_POSITIONS, eps=1e-5, name=name)


class Weights:
    """GPT-2 parameters as plain tensors, in HF's Conv1D layout (y = x @ W + b)."""

    def __init__(self, cfg, device, dtype, seed=0, model_dir=None):
        self.cfg = cfg
        self.model_dir = model_dir
        if model_dir:
            self._load(model_dir, device, dtype)
        else:
            self._random(seed, device, dtype)
        self.wte_t = self.wte.t().contiguous()  # tied LM head, [C, V]

    def _random(self, seed, device, dtype):
        """GPT-2's init: normal(0, 0.02), residual projections scaled by 1/sqrt(2L)."""
        torch.manual_seed(seed)
        C, V, L = self.cfg["n_embd"], self.cfg["vocab"], self.cfg["n_layer"]

        def normal(*shape, std=0.02):
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, std)

        def zeros(*shape):
            return torch.zeros(*shape, device=device, dtype=dtype)

        def ones(*shape):
            return torch.ones(*shape, device=device, dtype=dtype)

        self.wte = normal(V, C)
        self.wpe = normal(self.cfg["n_positions"], C, std=0.01)
        proj_std = 0.02 / math.sqrt(2 * L)
        self.layers = [dict(
            ln1_w=ones(C), ln1_b=zeros(C),
            attn_w=normal(C, 3 * C), attn_b=zeros(3 * C),
            proj_w=normal(C, C, std=proj_std), proj_b=zeros(C),
            ln2_w=ones(C), ln2_b=zeros(C),
            fc_w=normal(C, 4 * C), fc_b=zeros(4 * C),
            fcproj_w=normal(4 * C, C, std=proj_std), fcproj_b=zeros(C),
        ) for _ in range(L)]
        self.lnf_w = ones(C)
        self.lnf_b = zeros(C)

    def _load(self, model_dir, device, dtype):
        from safetensors.torch import load_file

        sd = load_file(os.path.join(model_dir, "model.safetensors"))

        def get(name):
            t = sd.get(f"transformer.{name}", sd.get(name))
            if t is None:
                raise KeyError(f"{model_dir}/model.safetensors has no {name}")
            return t.to(device=device, dtype=dtype)

        self.wte = get("wte.weight")
        self.wpe = get("wpe.weight")
        self.layers = [{ours: get(f"h.{i}.{theirs}") for ours, theirs in LAYER_NAMES.items()}
                       for i in range(self.cfg["n_layer"])]
        self.lnf_w = get("ln_f.weight")
        self.lnf_b = get("ln_f.bias")

    def param_count(self):
        n = self.wte.numel() + self.wpe.numel() + self.lnf_w.numel() + self.lnf_b.numel()
        return n + sum(t.numel() for layer in self.layers for t in layer.values())

    def describe(self, seed):
        return self.model_dir or f"random, torch.manual_seed({seed})"


def mlp(cfg, layer, x):
    """x + MLP(LN2(x)) for x [rows, C]."""
    C = cfg["n_embd"]
    h = F.layer_norm(x, (C,), layer["ln2_w"], layer["ln2_b"], cfg["eps"])
    h = F.gelu(torch.addmm(layer["fc_b"], h, layer["fc_w"]), approximate="tanh")
    return x + torch.addmm(layer["fcproj_b"], h, layer["fcproj_w"])


def prefill(w, tokens, k_cache, v_cache):
    """Batched eager prefill of N prompts of L tokens [N, L]: writes K/V into
    k_cache[i][:N, :, :L] / v_cache[i][...] for each layer i (each [N', H, T, D],
    T >= L) and returns the last position's logits [N, V]."""
    cfg = w.cfg
    N, L = tokens.shape
    H, C = cfg["n_head"], cfg["n_embd"]
    D = C // H
    pos = torch.arange(L, device=tokens.device)
    x = (w.wte[tokens] + w.wpe[pos][None]).reshape(N * L, C)
    for i, layer in enumerate(w.layers):
        h = F.layer_norm(x, (C,), layer["ln1_w"], layer["ln1_b"], cfg["eps"])
        qkv = torch.addmm(layer["attn_b"], h, layer["attn_w"]).view(N, L, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [N, H, L, D] each
        k_cache[i][:N, :, :L] = k
        v_cache[i][:N, :, :L] = v
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [N, H, L, D]
        y = y.transpose(1, 2).reshape(N * L, C)
        x = x + torch.addmm(layer["proj_b"], y, layer["proj_w"])
        x = mlp(cfg, layer, x)
    last = x.view(N, L, C)[:, -1]
    last = F.layer_norm(last, (C,), w.lnf_w, w.lnf_b, cfg["eps"])
    return last @ w.wte_t


def hf_model(w):
    """transformers' GPT2LMHeadModel (eval, w's device and dtype) with w's weights:
    from w.model_dir itself when w came from one, else copied from w. Returns
    (model, None), or (None, reason) when transformers cannot be imported; raises
    if the copied weights do not fill the model."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except Exception as e:  # noqa: BLE001 - report any import problem, go on
        return None, f"transformers not importable: {e}"
    device, dtype, cfg = w.wte.device, w.wte.dtype, w.cfg
    if w.model_dir:
        return GPT2LMHeadModel.from_pretrained(w.model_dir, dtype=dtype).to(device).eval(), None
    hf_cfg = GPT2Config(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                        vocab_size=cfg["vocab"], n_positions=cfg["n_positions"],
                        layer_norm_epsilon=cfg["eps"])
    model = GPT2LMHeadModel(hf_cfg).to(device=device, dtype=dtype).eval()
    sd = {"transformer.wte.weight": w.wte, "transformer.wpe.weight": w.wpe,
          "transformer.ln_f.weight": w.lnf_w, "transformer.ln_f.bias": w.lnf_b,
          "lm_head.weight": w.wte}
    for i, layer in enumerate(w.layers):
        for ours, theirs in LAYER_NAMES.items():
            sd[f"transformer.h.{i}.{theirs}"] = layer[ours]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith((".attn.bias", "masked_bias"))]
    if missing or unexpected:
        raise ValueError(f"state dict: missing {missing} unexpected {unexpected}")
    return model, None


def compare(name, ours, ref, dtype):
    """max |ours - ref| against a tolerance relative to the logits' scale: 2% in
    fp16/bf16 (accumulation order differs between kernels), 0.1% in float32."""
    scale = ref.abs().max().item()
    err = (ours.float() - ref).abs().max().item()
    tol = (1e-3 if dtype == torch.float32 else 2e-2) * scale
    same_argmax = (ours.float().argmax(-1) == ref.argmax(-1)).float().mean().item()
    return {"what": name, "status": "ok" if err <= tol else "FAILED", "max_abs_err": err,
            "tolerance": tol, "logit_scale": scale, "argmax_agreement": same_argmax}


def check_tokens(cfg, n, length, device):
    """The checks' prompt tokens [n, length], from a fixed CPU generator."""
    g = torch.Generator(device="cpu").manual_seed(1)
    return torch.randint(0, cfg["vocab"], (n, length), generator=g).to(device)


class Timer:
    """CUDA events on a GPU, perf_counter on the CPU; times in ms."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(self, a, b):
        if self.cuda:
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self, device=None):
        if self.cuda:
            torch.cuda.synchronize(device or self.device)


def capture_graph(step, warmup=3):
    """Runs `step` `warmup` times on a side stream (cuBLAS handles, kernel
    choices), then captures one call in a CUDA graph; returns the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return graph


def pct(xs, q):
    """q-quantile (0..1) of xs, nearest rank."""
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def csv_ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def prefill_shapes(s):
    """'1x256,16x256' -> [(1, 256), (16, 256)]."""
    return [tuple(int(x) for x in p.lower().split("x")) for p in s.split(",") if p.strip()]


def device_name(device):
    import platform
    return torch.cuda.get_device_name(device) if device.type == "cuda" else (
        platform.processor() or "cpu")
