import torch, statistics, time
from eaglespec.runtime.loading import load_target
from eaglespec.spec.speculative import DraftOptions, build_proposer
from eaglespec.config import GenerationConfig
from eaglespec.engine.generate import Engine, Request
torch.set_num_threads(2)
t = load_target()
tok = t.tokenizer
synthetic = list(range(5, 69))
natural = tok(tok.apply_chat_template([{"role": "user", "content": "Write a short paragraph about why the sky looks blue, for a curious ten-year-old."}], add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
print("synthetic decodes as:", repr(tok.decode(synthetic)[:120]))
with torch.inference_mode():
    for name, p in (("synthetic", synthetic), ("natural", natural)):
        for b in (1, 4):
            eng = Engine(t, build_proposer(t, DraftOptions(tree="chain", depth=1)), max_batch_size=b)
            out = eng.generate([Request(p, GenerationConfig(20, ignore_eos=True)) for _ in range(b)])
            st = out[0].stats
            print(name, "b", b, "depth-1 acceptance", st.acceptance_by_position(1), "tau", round(st.tau, 2), "forwards", st.target_forwards, "text:", repr(tok.decode(out[0].token_ids)[:80]))
