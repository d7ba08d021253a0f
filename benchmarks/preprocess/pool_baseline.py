"""The script a user would write instead of the Beam job: a multiprocessing.Pool over the clips.

TensorFlowTTS-style: every clip is read and decoded once, resampled if needed, trimmed, turned into
a librosa log-mel with the job's settings, and saved as one .npy per clip, on every core. No
statistics, filtering, padding or shards: the per-clip work only, which is the floor the job's
wall time is compared with. Run as its own process so its wall time includes its imports.

Run: python -m benchmarks.preprocess.pool_baseline --corpus DIR --out DIR [--workers N]
"""

from __future__ import annotations

import argparse
import os
import time


def _work(job):
    wav, out, sr, top_db, n_fft, hop, win, n_mels, fmin, fmax, floor, job_mel = job
    import numpy as np
    import soundfile as sf

    from melshards.preprocess.clip.audio import load_librosa

    librosa = load_librosa()  # `import librosa`, one process at a time until numba's caches are written

    y, file_sr = sf.read(wav, dtype="float32", always_2d=True)
    y = y.mean(axis=1)
    if file_sr != sr:
        y = librosa.resample(y, orig_sr=file_sr, target_sr=sr, res_type="soxr_hq")
    y, _ = librosa.effects.trim(y, top_db=top_db)
    if job_mel:  # the job's own log_mel: the same numbers, a matmul where librosa uses einsum
        from melshards.preprocess.clip.audio import log_mel
        from melshards.preprocess.config import MelConfig

        mel = log_mel(y, sr, MelConfig(n_fft, hop, win, n_mels, fmin, fmax, floor, 1.0))
        np.save(out, mel)
        return mel.shape[0]
    mel = librosa.feature.melspectrogram(
        y=y, sr=sr, n_fft=n_fft, hop_length=hop, win_length=win, n_mels=n_mels, fmin=fmin, fmax=fmax, power=1.0
    )
    np.save(out, np.log(np.maximum(mel, floor)).T.astype(np.float32))
    return mel.shape[1]


def _one_blas_thread():
    # as the job does: N processes x N BLAS threads each oversubscribe the cores (a fair baseline,
    # not the slowest script a user could write)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="LJSpeech layout: metadata.csv + wavs/<id>.wav")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument(
        "--job-mel",
        action="store_true",
        help="use the job's log_mel (librosa stft + cached filter bank + matmul) instead of "
        "librosa.feature.melspectrogram, whose einsum is most of the script's CPU",
    )
    args = ap.parse_args(argv)
    t = time.perf_counter()
    # before numpy/scipy load their BLAS (threadpoolctl can only limit libraries already loaded)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from multiprocessing import Pool

    from melshards.preprocess.config import PreprocessConfig  # the job's mel settings (a dataclass: cheap)

    cfg = PreprocessConfig()
    m = cfg.mel
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.corpus, "metadata.csv"), encoding="utf-8") as f:
        ids = [line.split("|")[0] for line in f if line.strip()]
    jobs = [
        (
            os.path.join(args.corpus, "wavs", f"{i}.wav"),
            os.path.join(args.out, f"{i}.npy"),
            cfg.audio.sample_rate,
            cfg.audio.trim_top_db,
            m.n_fft,
            m.hop_length,
            m.win_length,
            m.n_mels,
            m.fmin,
            m.fmax,
            m.log_floor,
            args.job_mel,
        )
        for i in ids
    ]
    with Pool(args.workers, initializer=_one_blas_thread) as pool:
        frames = sum(pool.imap_unordered(_work, jobs, chunksize=8))
    print(f"{len(jobs)} clips, {frames} frames, {args.workers} processes, {time.perf_counter() - t:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
