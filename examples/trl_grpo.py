"""TRL's GRPOTrainer, two steps on CPU, against a live ORS Platform over OpenEnv.

A tiny Qwen3-shaped model with random weights and a tokenizer trained here on a few lines of text:
nothing is downloaded. It learns nothing in two steps; what it shows is the loop a real run uses, end
to end: TRL's ``environment_factory`` class (the one in docs/trl.md), one platform episode per
rollout, the dataset's ``task_index`` column forwarded to ``reset(**row)`` and honoured, and every
episode filed under one run (``run=`` in reset), which the run's page and ``GET /api/v1/runs/{name}``
then show.

    pip install 'trl==1.16.0' torch            # not part of the platform's dependencies
    python examples/trl_grpo.py --url http://127.0.0.1:8000 --api-key ors_... [--run trl-demo]

(``ORS_URL`` / ``ORS_API_KEY`` work too.) See examples/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
import uuid
from typing import Any

ENV = "builtin/math"
SPLIT = "train"
PLAYED: list[int] = []  # the task index of each episode, as the platform reports it


def make_environment_class(base_url: str, api_key: str, run: str) -> type:
    """The ``environment_factory`` class for an environment hosted on the platform (docs/trl.md)."""
    from openenv.core.generic_client import GenericEnvClient

    class MathEnv:
        """One platform episode per rollout: reset opens it, tools are its methods, get_reward scores it."""

        def __init__(self) -> None:
            self.client = GenericEnvClient(base_url=f"{base_url}/openenv/{ENV}",
                                           headers={"X-API-Key": api_key}).sync()
            self.client.connect()
            self.reward = 0.0
            self.done = False

        def reset(self, **row: Any) -> str:
            # TRL passes the dataset row; its task_index column picks the task (prompt is ignored).
            result = self.client.reset(split=SPLIT, run=run, **row)
            self.reward, self.done = 0.0, False
            PLAYED.append(result.observation["metadata"]["index"])
            return "\n".join(b["text"] for b in result.observation["metadata"]["prompt"] if b.get("type") == "text")

        def submit(self, answer: str) -> str:
            """Submit the final answer to the arithmetic question.

            Args:
                answer: The answer, as digits.
            """
            if self.done:
                raise ValueError("The episode is over.")
            result = self.client.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer}})
            self.reward, self.done = result.reward or 0.0, result.done
            error = result.observation.get("error")
            if error:
                return f"Error: {error['message']}"
            return " ".join(b.get("text", "") for b in result.observation["result"]["blocks"])

        def get_reward(self) -> float:
            return float(self.reward)

    return MathEnv


def tiny_model(workdir: str):
    """A Qwen3-shaped causal LM of ~0.1M parameters and a byte-level BPE tokenizer trained on a few
    lines, with Qwen3's chat template (shipped with TRL), which TRL knows how to parse tool calls from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
                "<tool_response>", "</tool_response>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["What is 12 + 30? Answer with the submit tool.", '{"name": "submit", "arguments": {"answer": "42"}}',
              "system user assistant tool You are a helpful assistant. Correct. Incorrect."]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = qwen3_chat_template
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(workdir)
    tokenizer.save_pretrained(workdir)
    return workdir, tokenizer


def run_summary(base_url: str, api_key: str, run: str) -> dict:
    request = urllib.request.Request(f"{base_url}/api/v1/runs/{run}", headers={"X-API-Key": api_key})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ORS_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("ORS_API_KEY"))
    parser.add_argument("--run", default=f"trl-demo-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workdir", default="var/trl-demo")
    args = parser.parse_args()
    if not args.api_key:
        parser.error("an API key is needed: --api-key or ORS_API_KEY (make run prints one)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model_dir, tokenizer = tiny_model(args.workdir)
    # Four tasks, each one dataset row; TRL forwards the row to reset(**row), task_index included.
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Solve it."}] for _ in range(4)],
                                 "task_index": [3, 5, 8, 13]})
    config = GRPOConfig(output_dir=f"{args.workdir}/out", max_steps=args.steps, per_device_train_batch_size=4,
                        num_generations=2, max_completion_length=24, max_tool_calling_iterations=2,
                        learning_rate=1e-4, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                        save_strategy="no", seed=0)
    started = time.monotonic()
    trainer = GRPOTrainer(model=model_dir, processing_class=tokenizer, args=config, train_dataset=dataset,
                          environment_factory=make_environment_class(args.url.rstrip("/"), args.api_key, args.run))
    trainer.train()
    elapsed = time.monotonic() - started
    summary = run_summary(args.url.rstrip("/"), args.api_key, args.run)
    print(json.dumps({
        "run": args.run, "steps": trainer.state.global_step, "seconds": round(elapsed, 1),
        "episodes": summary.get("episodes"), "mean_reward": summary.get("mean_reward"),
        "points": len(summary.get("series", [])), "task_indices_played": sorted(set(PLAYED)),
        "log": [{k: v for k, v in entry.items() if k in ("step", "loss", "reward", "num_tokens")}
                for entry in trainer.state.log_history],
    }, indent=2, default=str))


if __name__ == "__main__":
    main()
