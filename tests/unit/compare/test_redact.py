"""Secrets in argv and environment values are masked before anything is stored."""

from __future__ import annotations

from stepscope.capture.environment import setup_env
from stepscope.redact import MASK, is_secret_name, redact_argv, redact_text

HF = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"


def test_secret_options_urls_and_token_shapes_are_masked():
    argv = ["train.py", f"--token={HF}", "--password", "hunter2", "--api-key=abc123", "--hf_token", "xyz",
            "--data", "https://alice:s3cret@example.com/data", "db.password=pw", f"note {HF} end",
            "--lr", "0.1", "--author", "me", "--auth-token", "--verbose"]
    out = redact_argv(argv, force=True)
    text = " ".join(out)
    for secret in (HF, "hunter2", "abc123", "xyz", "s3cret", "alice", "=pw"):
        assert secret not in text, secret
    assert out[:5] == ("train.py", f"--token={MASK}", "--password", MASK, f"--api-key={MASK}")
    assert f"https://{MASK}@example.com/data" in out
    assert ("--lr", "0.1", "--author", "me") == out[-6:-2]  # not secrets: kept
    assert out[-2:] == ("--auth-token", "--verbose")  # an option after a secret option is not its value


def test_names_are_split_into_words():
    assert is_secret_name("--api_key") and is_secret_name("WANDB_API_KEY") and is_secret_name("--secret-key")
    assert not is_secret_name("--author") and not is_secret_name("--keyframes") and not is_secret_name("--tokenizer")
    assert redact_text("git+https://u:p@host/x.git") == f"git+https://{MASK}@host/x.git"


def test_opt_out(monkeypatch):
    monkeypatch.setenv("STEPSCOPE_REDACT", "0")
    assert redact_argv(["--token=x"]) == ("--token=x",)
    assert redact_argv(["--token=x"], force=True) == (f"--token={MASK}",)


def test_setup_env_keeps_what_matters_and_masks_secrets(monkeypatch):
    monkeypatch.delenv("STEPSCOPE_REDACT", raising=False)
    env = setup_env({"OMP_NUM_THREADS": "4", "NCCL_IB_HCA": "mlx5", "HOME": "/root", "TORCH_HUB_TOKEN": "t",
                     "CUDA_VISIBLE_DEVICES": "0,1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "4",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_HUB_TOKEN": MASK}


def test_http_auth_headers_are_masked():
    argv = ["fetch.py", "--header", "Authorization: Bearer eyJhbGciOi.payload.sig", "-H", "X-Api-Key: k3y",
            "-H", "Cookie: session=abc; theme=dark", "--header=Proxy-Authorization: Basic dXNlcjpwYXNz",
            "-H", "Authorization:", "Bearer", "split-cred", "-H", "Accept: text/html"]
    out = redact_argv(argv, force=True)
    text = " ".join(out)
    for secret in ("eyJhbGciOi", "k3y", "session=abc", "dXNlcjpwYXNz", "split-cred"):
        assert secret not in text, secret
    assert out[2] == f"Authorization: {MASK}" and out[4] == f"X-Api-Key: {MASK}" and out[6] == f"Cookie: {MASK}"
    assert out[7] == f"--header=Proxy-Authorization: {MASK}"
    assert out[9:12] == ("Authorization:", "Bearer", MASK)
    assert out[-1] == "Accept: text/html"  # not a secret header: kept
    assert redact_text("curl -H 'Authorization: token ghx' url") == f"curl -H 'Authorization: {MASK}' url"
    assert redact_text("Authorization: token ghx\nnext line") == f"Authorization: {MASK}\nnext line"
    assert redact_text("call with Bearer abc123 now") == f"call with Bearer {MASK} now"


def test_key_value_and_assignments_whose_name_holds_a_secret_word():
    out = redact_argv(["train.py", "token: X1", "MYTOKEN=X2", "hfToken=X3", "DB_PASSWORD=X4", "MYAPIKEY=X5",
                       "env GH_TOKEN=X6 python t.py", "https://h/x?access_token=X7&page=2", '{"secret": "X8", "lr": 1}',
                       "password:", "X9"], force=True)
    text = " ".join(out)
    for index in range(1, 10):
        assert f"X{index}" not in text, (index, text)
    assert out[1:6] == (f"token: {MASK}", f"MYTOKEN={MASK}", f"hfToken={MASK}", f"DB_PASSWORD={MASK}",
                        f"MYAPIKEY={MASK}")
    assert out[6] == f"env GH_TOKEN={MASK} python t.py" and out[7] == f"https://h/x?access_token={MASK}&page=2"
    assert out[8] == f'{{"secret": "{MASK}", "lr": 1}}'
    kept = ["--tokenizer", "bert", "--author=me", "TOKENIZERS_PARALLELISM=false", "time: 3s", "a=b",
            "http://host:8080/x", "--keyframes", "4", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert redact_argv(kept, force=True) == tuple(kept)
    assert is_secret_name("MYTOKEN") and is_secret_name("Authorization") and is_secret_name("set-cookie")
    assert not is_secret_name("tokenizer") and not is_secret_name("TOKENIZERS_PARALLELISM")
