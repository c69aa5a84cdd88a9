"""Skill library at scale: indexing 200 generated skills (5 to 30 files each) and per-skill search latency.

    python bench/skills_index.py [--skills 200]       (needs: pip install -e '.[dev,bench]')

Indexes the library twice, in one run: offline (extractive), then through litellm against the fake
OpenAI-compatible server (tests/fakellm.py, its own process, answering at once) to count model calls and see the
pipeline's own cost per file. Then times warm `find_skills` over 200 questions.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kindex  # noqa: E402
from kindex.llm import import_litellm  # noqa: E402

TOPICS = (
    "backup restore snapshot replication region database postgres mysql redis kafka queue invoice refund payment "
    "pdf excel csv chart report email calendar slack github deploy docker kubernetes terraform monitoring alert "
    "logging tracing search index cache translation summary image video audio transcription security audit"
).split()


def make_library(root: Path, count: int, rng: random.Random) -> int:
    files = 0
    for i in range(count):
        words = rng.sample(TOPICS, 4)
        name = f"{words[0]}-{words[1]}-{i:03d}"
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: Work with {words[0]} and {words[1]} for {words[2]} tasks.\n---\n"
            f"# {name}\n\nUse this skill for {' '.join(words)}.\n",
            encoding="utf-8",
        )
        n = rng.randint(5, 30) - 1
        for j in range(n):
            size = 40 if rng.random() < 0.9 else 600  # many small reference files, a few large ones
            body = " ".join(rng.choices(TOPICS, k=size))
            sub = folder / ("reference" if j % 3 else "scripts-docs") / f"{rng.choice(TOPICS)}-{j}.md"
            sub.parent.mkdir(exist_ok=True)
            sub.write_text(f"# {sub.stem}\n\n{body}.\n", encoding="utf-8")
        files += n + 1
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skills", type=int, default=200)
    args = ap.parse_args()
    rng = random.Random(11)
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    server = subprocess.Popen([sys.executable, "-m", "tests.fakellm", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    import_litellm()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(tmp) / "lib"
            files = make_library(lib, args.skills, rng)
            assert kindex.validate_skills(lib) == []
            t0 = time.perf_counter()
            offline = kindex.reindex(lib)
            t_off = time.perf_counter() - t0
            rows.append(
                f"| offline reindex ({files} files in {args.skills} skills) | {t_off:.2f} s, "
                f"{files / t_off:.0f} files/s, {offline.usage.calls} model calls |"
            )
            llm_lib = Path(tmp) / "llm"
            shutil.copytree(lib, llm_lib, ignore=shutil.ignore_patterns(".kindex", "index.json"))
            settings = kindex.LLMSettings(model="openai/bench", api_base=url)
            t0 = time.perf_counter()
            report = kindex.reindex(llm_lib, kindex.Options(llm=settings, concurrency=16))
            t_llm = time.perf_counter() - t0
            rows.append(
                f"| reindex through litellm, model answering at once | {t_llm:.2f} s, {files / t_llm:.0f} "
                f"files/s, {report.usage.calls} model calls ({files} files + 1 root) |"
            )
            again = kindex.reindex(llm_lib, kindex.Options(llm=settings, concurrency=16))
            rows.append(f"| re-run, nothing changed | {again.usage.calls} model calls, {again.wall_seconds:.2f} s |")

            questions = [" ".join(rng.sample(TOPICS, 3)) for _ in range(200)]
            kindex.find_skills(lib, questions[0])
            times = []
            for q in questions:
                t0 = time.perf_counter()
                hits = kindex.find_skills(lib, q, limit=10)
                times.append(time.perf_counter() - t0)
                assert len({h.name for h in hits}) == len(hits)
            p99 = statistics.quantiles(times, n=100)[98]
            rows.append(
                f"| `find_skills` warm, limit 10, 200 questions | p50 {statistics.median(times) * 1000:.1f} ms, "
                f"p99 {p99 * 1000:.1f} ms |"
            )
    finally:
        server.kill()
    print("| measure | value |\n|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
