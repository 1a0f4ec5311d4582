"""The official OpenAI Python SDK against `lucebox serve`: models, chat completions streamed and
not, text completions, and the SDK's error classes for the server's error statuses.

Runs the release binary (LUCEBOX_BIN, default target/release/lucebox) on a free loopback port
with SmolLM2-135M from the model directory (LUCEBOX_MODEL_DIR).
"""

import os
import pathlib
import signal
import subprocess
import unittest

import openai

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct-q4_1"


def model_path():
    directory = os.environ.get("LUCEBOX_MODEL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lucebox", "models"
    )
    path = pathlib.Path(directory) / f"{MODEL}.gguf"
    if not path.is_file():
        raise AssertionError(f"{path} not found: run `lucebox fetch {MODEL}` (tests/run-all does)")
    return path


class OpenAiSdk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary = os.environ.get("LUCEBOX_BIN") or str(ROOT / "target" / "release" / "lucebox")
        cls.server = subprocess.Popen(
            [binary, "serve", "--model", str(model_path()), "--port", "0", "--api-key", "sk-test"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        address = None
        for line in cls.server.stderr:
            if line.startswith("lucebox: listening on "):
                address = line.split()[-1]
            if line.startswith("lucebox: ready"):
                break
        if address is None:
            cls.server.kill()
            raise AssertionError("the server did not start")
        cls.client = openai.OpenAI(base_url=f"{address}/v1", api_key="sk-test", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        cls.server.wait(timeout=30)
        cls.server.stderr.close()

    def test_models_lists_the_served_model(self):
        ids = [model.id for model in self.client.models.list()]
        self.assertEqual(ids, [MODEL])

    def test_chat_streamed_equals_chat_not_streamed(self):
        messages = [{"role": "user", "content": "Count from one to twenty in words."}]
        whole = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=10, temperature=0
        )
        text = whole.choices[0].message.content
        self.assertTrue(text)
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 10)
        stream = self.client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        self.assertEqual("".join(pieces), text)
        self.assertEqual(finish, "length")
        self.assertEqual(usage.completion_tokens, 10)

    def test_text_completion(self):
        completion = self.client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0
        )
        self.assertIn("Paris", completion.choices[0].text)

    def test_logprobs_parse_as_the_sdk_types(self):
        whole = self.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        choice = whole.choices[0]
        entries = choice.logprobs.content
        self.assertEqual("".join(e.token for e in entries), choice.message.content)
        for entry in entries:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertEqual(entry.top_logprobs[0].token, entry.token)

    def test_errors_raise_the_sdk_classes(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2
            )
        self.assertEqual(caught.exception.body["param"], "n")
        stranger = openai.OpenAI(base_url=self.client.base_url, api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            stranger.models.list()


if __name__ == "__main__":
    unittest.main()
