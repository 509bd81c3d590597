"""gptbook.reward (chapter 17): rollouts and their rewards, the group advantages, the policy loss against its
definition, RL runs end to end (bit-exact resume, the rollouts' numbers in the metrics, the `gptbook rl` CLI),
pass@k against counting subsets, bits per byte against its identity."""

import itertools
import math
import re

import pytest
import torch

from gptbook.chat import IGNORE, chat_ids, task_items
from gptbook.checkpoint import load_checkpoint
from gptbook.model import text_nats
from gptbook.reward import (
    answer_rows,
    bits_per_byte,
    group_advantages,
    kl_per_token,
    pass_at_k,
    policy_loss,
    rl_data,
    rollouts,
    token_logp,
)
from gptbook.runs import read_metrics
from gptbook.train import TrainConfig, train, train_rl

from test_chat import SMALL, base_run, sft  # noqa: F401  (fixtures)
from test_cli import call

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def chat_run(base_run, tmp_path_factory):  # noqa: F811
    "A four-step fine-tuning of the base run on `reverse`: a chat model to start RL from."
    out = tmp_path_factory.mktemp("sft")
    sft(out, base_run)
    return out


def rl(out, init, **kw):
    opts = dict(init_from=str(init), task="reverse", out_dir=str(out), max_iters=4, eval_interval=2, eval_iters=1)
    return train_rl(**{**opts, "batch_size": 8, "group_size": 4, "progress": False, **kw})


def test_rollouts_reward_exactly_the_right_answer_ended(chat_run):
    ck = load_checkpoint(chat_run)
    items = task_items("reverse", "train", 3)
    prompts, answers, rewards = rollouts(ck.model, ck.tokenizer, items, 5, torch.Generator().manual_seed(0))
    assert len(prompts) == len(answers) == 15 and rewards.shape == (3, 5)
    end = chat_ids(ck.tokenizer)[2]
    for i, a in enumerate(answers):
        right = a[-1:] == [end] and ck.tokenizer.decode(a[:-1]) == items[i // 5][1]
        assert rewards.flatten()[i] == right


def test_group_advantages_center_and_scale_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    adv = group_advantages(rewards)
    torch.testing.assert_close(adv.mean(1), torch.zeros(3), atol=1e-6, rtol=0)
    assert torch.equal(adv[1], torch.zeros(4))  # all right: nothing to learn
    torch.testing.assert_close(adv[0].std(), torch.tensor(1.0), atol=1e-3, rtol=0)


def test_policy_loss_is_minus_the_advantage_weighted_log_likelihood():
    torch.manual_seed(0)
    x, y = answer_rows([[1, 2, 3], [4, 5]], [[6, 7], [8]])
    assert x.shape == y.shape == (2, 4)
    assert y.tolist() == [[IGNORE, IGNORE, 6, 7], [IGNORE, 8, IGNORE, IGNORE]]
    logits = torch.randn(2, 4, 10, requires_grad=True)
    adv = torch.tensor([0.5, -2.0])
    logp = logits.log_softmax(-1)
    by_hand = -(0.5 * (logp[0, 2, 6] + logp[0, 3, 7]) - 2.0 * logp[1, 1, 8]) / 3
    torch.testing.assert_close(policy_loss(logits, y, adv), by_hand)
    policy_loss(logits, y, adv).backward()
    assert logits.grad[y == IGNORE].abs().max() == 0  # prompts and padding: no gradient
    assert kl_per_token(token_logp(logits, y), token_logp(logits, y), y) == 0.0


def test_rl_run_resumes_bit_exact_and_records_the_rollouts(chat_run, tmp_path, capsys):
    straight = rl(tmp_path / "straight", chat_run)
    out = capsys.readouterr().out
    assert "reward " in out and "kl " in out
    records = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert {"reward", "pass_rate", "answer_tokens", "kl"} <= set(records[-1])
    rl(tmp_path / "resumed", chat_run, max_iters=2)
    resumed = train_rl(out_dir=str(tmp_path / "resumed"), resume=True, max_iters=4, progress=False)
    for (name, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(p, q), name
    data = rl_data("reverse", load_checkpoint(chat_run).tokenizer, n_items=20)
    fine_tuned = {q for q, _ in task_items("reverse", "train", 5000)}
    assert not fine_tuned & {q for q, _ in data.items}  # RL asks questions the fine-tuning never saw


def test_rl_cli_needs_a_chat_model_and_a_task(chat_run, tmp_path, capsys):
    status, out, _ = call(capsys, "rl", "--help")
    assert status == 0 and "--group-size" in out and "--task" in out
    status, _, err = call(capsys, "rl", "--task", "reverse", "--out", tmp_path / "x")
    assert status != 0 and "--init-from" in err
    argv = ["rl", "--init-from", chat_run, "--task", "reverse", "--out", tmp_path / "cli", "--max-iters", "1"]
    status, out, err = call(capsys, *argv, "--batch-size", "4", "--eval-iters", "1", "--no-progress")
    assert status == 0, err
    assert "reward" in out and "done in" in out


@pytest.mark.parametrize("n, c, k", [(10, 3, 1), (10, 3, 4), (7, 0, 3), (6, 6, 2), (12, 2, 12), (9, 8, 1)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_answer(n, c, k):
    subsets = list(itertools.combinations(range(n), k))
    assert math.isclose(pass_at_k(n, c, k), sum(any(i < c for i in s) for s in subsets) / len(subsets), rel_tol=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_bits_per_byte_identity():
    text = "héllo, wörld"  # 12 characters, 14 bytes
    assert math.isclose(bits_per_byte(14 * math.log(2), text), 1.0, rel_tol=1e-12)
    assert math.isclose(bits_per_byte(7.0, text), 7.0 / math.log(2) / 14, rel_tol=1e-12)


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    "A two-step character run: a second tokenizer for bits per byte."
    out = tmp_path_factory.mktemp("char")
    train(
        TrainConfig(out_dir=str(out), max_iters=2, eval_interval=2, eval_iters=1, progress=False, model_overrides=SMALL)
    )
    return out


def test_bits_per_byte_of_char_and_bpe_models_is_their_summed_loss(char_run, base_run, tmp_path, capsys):  # noqa: F811
    plays = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 3
    for run, text in ((char_run, plays), (base_run, plays + "Caf\u00e9, na\u00efve\n")):  # the BPE spells any byte
        (tmp_path / "t.txt").write_text(text, encoding="utf-8")
        ck = load_checkpoint(run)
        ids = torch.tensor(ck.tokenizer.encode(text))
        T, by_hand = ck.model.config.max_seq_len, 0.0
        with torch.no_grad():  # every window's log-probabilities in float64, summed
            for i in range(0, len(ids) - 1, T):
                x, y = ids[i : i + T], ids[i + 1 : i + 1 + T]
                logp = ck.model(x[None, : len(y)])[0].double().log_softmax(-1)
                by_hand -= logp.gather(1, y[:, None]).sum().item()
        nats = text_nats(ck.model, ids, batch_size=3)
        assert math.isclose(nats, by_hand, rel_tol=1e-6)  # float32 logits
        bpb = bits_per_byte(nats, text)
        assert math.isclose(bpb * math.log(2) * len(text.encode()), nats, rel_tol=1e-12)
        status, out, err = call(capsys, "eval", run, "--data", tmp_path / "t.txt")
        assert status == 0, err
        assert f"{bpb:.4f} bits/byte" in out
        chars = float(re.search(r"([\d.]+) bits/char", out).group(1))  # more bytes than characters: fewer bits each
        assert chars == pytest.approx(bpb * len(text.encode()) / len(text), abs=1e-4)


def test_eval_task_prints_exact_match_and_pass_at_k_and_writes_a_report(chat_run, tmp_path, capsys):
    argv = ["eval", chat_run, "--task", "reverse", "--n-test", "6", "--report", tmp_path / "card.md"]
    status, out, err = call(capsys, *argv)
    assert status == 0, err
    assert re.search(r"exact match [01]\.\d\d \[", out) and re.search(r"pass@1 [01]\.\d\d \[", out)
    card = (tmp_path / "card.md").read_text()
    assert card.startswith("# Report card") and "task: reverse" in card and "exact match" in card
    status, out, err = call(
        capsys, "eval", chat_run, "--task", "reverse", "--n-test", "4", "--samples", "3", "--pass-k", "2"
    )
    assert status == 0 and "pass@2 " in out, err
    for bad, says in [(["--samples", "2", "--pass-k", "3"], "--pass-k 3"), ([], "--data FILE")]:
        status, _, err = call(capsys, "eval", chat_run, *(["--task", "reverse"] if bad else []), *bad)
        assert status != 0 and says in err


def test_rl_steps_sample_group_size_answers_to_each_question(chat_run, tmp_path):
    trainer = rl(tmp_path / "groups", chat_run, max_iters=1, batch_size=6, group_size=3)
    x, (y, advantages, ref_logp) = trainer.data.rollout(trainer)
    assert x.shape[0] == y.shape[0] == ref_logp.shape[0] == 6  # two questions, three answers each
    assert advantages.view(2, 3).sum(1).abs().max() < 1e-5  # each group centred on its own mean
