"""The conformance tables' access to SGLang 0.5.23's wheel: the same session fixtures as the
SGLang contract tests (fetched once into .cache/), so a row can be computed by SGLang's code."""

from tests.sglang.conftest import sglang_src, sglang_target, sglang_wheel  # noqa: F401
