from __future__ import annotations

import functools
import math
import random
import re
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .corpus import tiny_shakespeare
from .sample import SamplingConfig, generate, pad_prompts
from .tokenizer import BPETokenizer


def split_of(question: str) -> str:
    "The split a question belongs to, by its CRC-32: train 80%, val 10%, test 10%; a text is always in the same one."
    bucket = zlib.crc32(question.encode()) % 10
    return "train" if bucket < 8 else "val" if bucket == 8 else "test"


@functools.cache
def _lines() -> list[str]:
    "Tiny Shakespeare's spoken lines of 20 to 40 characters (not the speakers' names)."
    lines = {line.strip() for line in tiny_shakespeare().splitlines()}
    return sorted(line for line in lines if 20 <= len(line) <= 40 and not line.endswith(":"))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(1000), rng.randrange(1000)
    return f"What is {a} + {b}?", str(a + b)


def _reverse(rng: random.Random) -> tuple[str, str]:
    digits = "".join(rng.choices("0123456789", k=rng.randint(3, 7)))
    return f"Reverse {digits}", digits[::-1]


def _last_word(rng: random.Random) -> tuple[str, str]:
    line = rng.choice(_lines())
    return f"Last word of: {line}", re.findall(r"[A-Za-z']+", line)[-1]


TASKS = {"add": _add, "reverse": _reverse, "last_word": _last_word}


def task_items(task: str, split: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    "`n` distinct (question, answer) items of `task` from `split` ('train', 'val' or 'test'), fixed by `seed`."
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    rng, items = random.Random(f"{task} {split} {seed}"), {}
    for _ in range(100 * n):
        question, answer = TASKS[task](rng)
        if split_of(question) == split:
            items.setdefault(question, answer)
            if len(items) == n:
                return list(items.items())
    raise ValueError(f"task {task!r} has fewer than {n:,} distinct {split} items: ask for fewer")


SPECIALS = ("<|user|>", "<|assistant|>", "<|end|>")  # a BPE's chat tokens
CHAR_SPECIALS = ("\ue000", "\ue001", "\ue002")  # a CharTokenizer's: characters of Unicode's private use area


def _specials(tokenizer) -> tuple[tuple[str, ...], dict]:
    if isinstance(tokenizer, BPETokenizer):
        return SPECIALS, tokenizer.special_tokens
    return CHAR_SPECIALS, tokenizer.stoi


def add_chat_tokens(tokenizer):
    "`tokenizer` with the user, assistant and end-of-turn tokens as new ids after its last: no other id changes."
    names, table = _specials(tokenizer)
    new = [s for s in names if s not in table]
    if isinstance(tokenizer, BPETokenizer):
        specials = tokenizer.special_tokens | {s: tokenizer.vocab_size + i for i, s in enumerate(new)}
        return BPETokenizer(list(tokenizer.merges), tokenizer.pattern, specials, tokenizer.ids)
    return type(tokenizer)(tokenizer.chars + new)


def chat_ids(tokenizer) -> tuple[int, int, int]:
    "The ids of the user, assistant and end-of-turn tokens of `tokenizer` (made by `add_chat_tokens`)."
    names, table = _specials(tokenizer)
    if not all(s in table for s in names):
        raise ValueError(f"{tokenizer!r} has no chat tokens: fine-tune the model on a task first (gptbook sft)")
    return tuple(table[s] for s in names)


ROLES = ("user", "assistant")


def check_messages(messages, generation: bool = False) -> None:
    "Turns alternate, user first, each a non-empty text with no chat token; to be answered, the last is the user's."
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    for i, m in enumerate(messages):
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
        if role != ROLES[i % 2]:
            raise ValueError(f"message {i} has role {role!r}, not {ROLES[i % 2]!r}: turns alternate, the user first")
        if not isinstance(content, str) or not content:
            raise ValueError(f"message {i} ({role}) must have a non-empty text as its content")
        if any(s in content for s in SPECIALS + CHAR_SPECIALS):
            raise ValueError(f"message {i} ({role}) contains a chat token, which only the template may write")
    if generation and len(messages) % 2 == 0:
        raise ValueError("the last message must be the user's: the model answers it")


def render(messages, tokenizer, generation: bool = False) -> tuple[list[int], list[int]]:
    "Ids of `messages` in the chat template, and a mask: 1 on what the assistant says (its end token included)."
    check_messages(messages, generation)
    user, assistant, end = chat_ids(tokenizer)
    ids, mask = [], []
    for m in messages:
        body = tokenizer.encode(m["content"]) + [end]
        ids += [user if m["role"] == "user" else assistant, *body]
        mask += [0] + [int(m["role"] == "assistant")] * len(body)
    if generation:  # the model's turn: it writes after <|assistant|>
        ids, mask = ids + [assistant], mask + [0]
    return ids, mask


def parse(ids, tokenizer) -> list[dict]:
    "The messages that `render` wrote as `ids`: its inverse."
    user, assistant, end = chat_ids(tokenizer)
    messages, body = [], None
    for t in ids:
        if body is None and t in (user, assistant):
            role, body = ROLES[t == assistant], []
        elif body is not None and t == end:
            messages.append({"role": role, "content": tokenizer.decode(body)})
            body = None
        elif body is None or t in (user, assistant):
            raise ValueError(f"id {t} at this place does not follow the chat template: {list(ids)[:20]}")
        else:
            body.append(t)
    return messages


SFT = dict(lr=3e-4, warmup_iters=20, max_iters=600, eval_interval=100, weight_decay=0.0)  # train_sft's defaults

IGNORE = -100  # F.cross_entropy's ignore_index: a target that takes no loss


def conversation_rows(items, tokenizer) -> torch.Tensor:
    "One row per (question, answer): its ids, and its targets (IGNORE but on the answer), padded to the longest."
    rendered = [render([{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenizer) for q, a in items]
    end, width = chat_ids(tokenizer)[2], max(len(ids) for ids, _ in rendered)
    rows = torch.full((len(rendered), 2, width), IGNORE, dtype=torch.long)
    for row, (ids, mask) in zip(rows, rendered):
        row[0] = torch.tensor(ids + [end] * (width - len(ids)))  # (L,) padded with end tokens, which take no loss
        row[1, : len(ids)] = torch.tensor([t if m else IGNORE for t, m in zip(ids, mask)])
    return rows


def get_rows(rows, batch_size, context_len, generator=None, rank=0, world_size=1, device=None):
    "Random conversations (whole rows), this rank's share: inputs x and targets y, (B, L - 1) each, as get_batch."
    ix = torch.randint(0, len(rows), (world_size * batch_size,), generator=generator)
    ix = ix[rank * batch_size : (rank + 1) * batch_size]
    x, y = rows[ix, 0, :-1], rows[ix, 1, 1:]
    return (x, y) if device is None else (x.to(device), y.to(device))


@dataclass
class ChatData:
    "A task's conversations, one per row, in place of a text's ids: the Trainer draws whole rows (`get_rows`)."

    train: torch.Tensor  # (N, 2, L): ids and targets
    val: torch.Tensor
    tokenizer: object
    get_batch = staticmethod(get_rows)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def chat_data(task: str, tokenizer, n_train: int = 10_000, n_val: int = 500) -> ChatData:
    "The conversations of `task`'s train and val items, read with `tokenizer` (which has the chat tokens)."
    rows = {s: conversation_rows(task_items(task, s, n), tokenizer) for s, n in (("train", n_train), ("val", n_val))}
    return ChatData(rows["train"], rows["val"], tokenizer)


def chat_ready(config, weights: dict, tokenizer):
    "A base model's config, weights and tokenizer with the chat tokens: new embedding rows at the old rows' mean."
    tokenizer = add_chat_tokens(tokenizer)
    grow = tokenizer.vocab_size - config.vocab_size
    if grow <= 0:
        return config, weights, tokenizer
    weights = dict(weights)
    for name in ("wte.weight", "lm_head.weight"):  # a tied head: both names hold the one table
        if name in weights:
            w = weights[name]  # (V, d_model)
            weights[name] = torch.cat([w, w.mean(0, keepdim=True).expand(grow, -1)])
    return config.replace(vocab_size=tokenizer.vocab_size), weights, tokenizer


# ---- LoRA


def _lora_forward(m: nn.Linear, inputs, out):
    x = F.dropout(inputs[0], m.lora_dropout, m.training)
    return out + m.lora_scale * (x @ m.lora_A.T) @ m.lora_B.T


def add_lora(model: nn.Module, rank: int, alpha: float = 16.0, dropout: float = 0.0, layers=("c_attn",)):
    "Freeze `model`; the linear layers named in `layers` learn a low-rank change: W x + (alpha / rank) B A x."
    for p in model.parameters():
        p.requires_grad_(False)
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in layers:
            w = m.weight
            m.lora_A = nn.Parameter(torch.randn(rank, m.in_features, device=w.device) / math.sqrt(m.in_features))
            m.lora_B = nn.Parameter(torch.zeros(m.out_features, rank, device=w.device))  # starts as the base
            m.register_buffer("lora_scale", torch.tensor(alpha / rank))
            m.lora_dropout, m.lora_hook = dropout, m.register_forward_hook(_lora_forward)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    "Fold each adapter into its layer's weight, W + (alpha / rank) B A, and remove it: a plain model again."
    for m in model.modules():
        if hasattr(m, "lora_A"):
            with torch.no_grad():
                m.weight += m.lora_scale * m.lora_B @ m.lora_A
            m.lora_hook.remove()
            del m.lora_A, m.lora_B, m.lora_scale, m.lora_dropout, m.lora_hook
    return model


# ---- answering and scoring


@torch.no_grad()
def replies(model, tokenizer, conversations, max_new_tokens: int = 32, batch_size: int = 64, **sampling) -> list[str]:
    "The model's answer to the last user message of each conversation, to its end token (greedy by default)."
    end, out = chat_ids(tokenizer)[2], []
    config = SamplingConfig(max_new_tokens, **({"temperature": 0.0} | sampling), stop=end)
    for b in range(0, len(conversations), batch_size):
        prompts = [render(c, tokenizer, generation=True)[0] for c in conversations[b : b + batch_size]]
        idx, mask = pad_prompts(prompts, device=next(model.parameters()).device)  # (B, T) each, padded on the left
        new = generate(model, idx, config=config, attention_mask=mask)[:, idx.size(1) :].tolist()
        out += [tokenizer.decode(row[: row.index(end)] if end in row else row) for row in new]
    return out


def exact_match(model, tokenizer, items, **sampling) -> list[bool]:
    "Whether the model's reply to each (question, answer) is the answer, exactly."
    answers = replies(model, tokenizer, [[{"role": "user", "content": q}] for q, _ in items], **sampling)
    return [got == a for got, (_, a) in zip(answers, items)]


def bootstrap(correct, baseline=None, n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    "Accuracy (or its lead over `baseline`, item by item) and a 95% bootstrap interval of it."
    x = torch.tensor(correct, dtype=torch.float64) - (0 if baseline is None else torch.tensor(baseline).double())
    g = torch.Generator().manual_seed(seed)
    means = x[torch.randint(0, len(x), (n, len(x)), generator=g)].mean(1)
    return x.mean().item(), means.quantile(0.025).item(), means.quantile(0.975).item()
