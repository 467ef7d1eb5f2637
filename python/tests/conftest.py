"""Skips loudly where the suite cannot run: each test module skips itself without torch, and the GPU
tests skip without a CUDA device. Collects the fuzzer's outcomes (test_fuzz.py) into one report."""

import datetime
import glob
import json
import os
import tempfile

import pytest

_FUZZ_FAILURES = []


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; runs ranks through torch.multiprocessing.spawn")
    config.addinivalue_line("markers", "stress: longer runs left to `make stress` (make test runs -m 'not stress')")
    config.addinivalue_line("markers", "fuzz: the fuzzer of the Python surface (test_fuzz.py): short runs in make "
                                       "test, long ones (also marked stress) in make stress")
    config.addinivalue_line("markers", "fault: a peer that stops mid-dispatch or mid-combine (test_fault.py)")
    # pytest-xdist's own mark, registered here too for runs without it.
    config.addinivalue_line("markers", "xdist_group(name): tests that run in one xdist worker (--dist loadgroup)")
    # The fuzzer's per-test outcome files: one directory per session, emptied by the controlling
    # process (not by pytest-xdist's workers, which inherit the variable).
    if not os.environ.get("EPKIT_FUZZ_REPORT_DIR"):
        os.environ["EPKIT_FUZZ_REPORT_DIR"] = os.path.join(tempfile.gettempdir(), f"epkit-fuzz-{os.getuid()}")
    if not hasattr(config, "workerinput"):
        d = os.environ["EPKIT_FUZZ_REPORT_DIR"]
        os.makedirs(d, exist_ok=True)
        for f in glob.glob(os.path.join(d, "*.json")):
            os.remove(f)


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        have_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    except ImportError:
        return  # the modules have skipped themselves
    if have_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to torch: the epkit GPU tests need at least one "
                                   "(ranks share GPUs as rank % device_count)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    if report.when == "call" and report.failed and "test_fuzz.py" in report.nodeid:
        text = str(report.longrepr)
        _FUZZ_FAILURES.append({"test": report.nodeid, "message": text.strip().splitlines()[-1][:300] if text else "",
                               "crash": any(k in text for k in ("crashed", "exit code", "exitcode", "signal", "SIG")),
                               "out_of_bounds": "guard region" in text})


def _fuzz_report():
    d = os.environ.get("EPKIT_FUZZ_REPORT_DIR", "")
    parts = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, "*.json")))
             if not f.endswith("fuzz-report.json")]
    if not parts and not _FUZZ_FAILURES:
        return None
    apis = {}
    for p in parts:
        for api, outcomes in p["apis"].items():
            a = apis.setdefault(api, {})
            for k, v in outcomes.items():
                a[k] = a.get(k, 0) + v
    try:
        import epkit
        commit = epkit.git_commit  # the commit the extension under test was built from
    except ImportError:
        commit = ""
    gpu = "none"
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    total = {k: sum(v.get(k, 0) for v in apis.values()) for k in ("computed", "computed+reported")}
    raised = sum(n for v in apis.values() for k, n in v.items() if k.startswith("raised"))
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit or "unknown",
        "gpu": gpu,
        "seeds": sorted({p.get("seed") for p in parts if p.get("seed") is not None}),
        "cases": sum(sum(v.values()) for v in apis.values()),
        "computed": total["computed"],
        "computed_and_reported": total["computed+reported"],
        "errors_raised": raised,
        "failed_tests": len(_FUZZ_FAILURES),
        "crashes": sum(f["crash"] for f in _FUZZ_FAILURES),
        "out_of_bounds_writes": sum(f["out_of_bounds"] for f in _FUZZ_FAILURES),
        "failures": _FUZZ_FAILURES,
        "apis": apis,
    }


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return
    rep = _fuzz_report()
    if rep is None:
        return
    path = os.path.join(os.environ["EPKIT_FUZZ_REPORT_DIR"], "fuzz-report.json")
    with open(path, "w") as f:
        json.dump(rep, f, indent=2)
    session.config._epkit_fuzz = (rep, path)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    got = getattr(config, "_epkit_fuzz", None)
    if not got:
        return
    rep, path = got
    tr = terminalreporter
    tr.section("epkit fuzz")
    tr.write_line(f"{rep['cases']} cases on {rep['gpu']} at {rep['commit']}: {rep['computed']} computed the reference, "
                  f"{rep['computed_and_reported']} computed and reported a device-side violation, "
                  f"{rep['errors_raised']} raised EpkitError naming the argument; failed tests {rep['failed_tests']} "
                  f"(crashes {rep['crashes']}, out-of-bounds writes {rep['out_of_bounds_writes']})")
    for api, outcomes in sorted(rep["apis"].items()):
        tr.write_line(f"  {api:32s} " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    tr.write_line(f"report: {path}")
