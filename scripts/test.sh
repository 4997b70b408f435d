#!/usr/bin/env bash
# The test command (README, "Two commands"; .ci/run runs it after its fmt and clippy checks):
#
#     scripts/test.sh [cargo test arguments...]
#
# As root, on a fresh Debian/Ubuntu machine, it first installs what the tests need and
# cargo does not provide:
#   - stress-ng (apt-get), whose filesystem stressors run under `lanefs run`
#     (cli/tests/run.rs);
#   - fuse3 (apt-get), for the test that mounts through `mount -t fuse.lanefs`, whose
#     mount(8) runs mount.fuse3 (everything else mounts with mount(2) and unmounts with
#     umount2(2) as root, and needs no package);
#   - pjdfstest 0.2.2 (cargo install), the POSIX test suite that fuse/tests/mount.rs runs
#     against a mount; LANEFS_REQUIRE_PJDFSTEST=1 then makes a missing binary a failure.
# Not as root it installs nothing and runs the tests; those that need root say so and skip.
#
# The tests run twice over the two FUSE transports (fuse/src/session.rs): the whole workspace
# with every mount on /dev/fuse (LANEFS_URING=off), then the mount suites (fuse/tests/mount.rs
# with pjdfstest, dircache.rs, stress.rs, handoff.rs, listing_races.rs,
# cli/tests/{cli,crash,memory,run}.rs) with every mount on
# io_uring (LANEFS_URING=on: a mount that cannot get io_uring fails). As root on a kernel with
# FUSE over io_uring (/sys/module/fuse/parameters/enable_uring exists) it turns that on first;
# where the kernel has none, or it is off and this is not root, the io_uring pass is skipped
# with a message.
#
# cli/tests/uring_unavailable.rs (uring=on|auto|off where io_uring cannot be had) turns
# fuse.enable_uring, which is the whole machine's, off for a moment in each of its tests, and
# puts it back. So it runs in the first pass only, where no mount asks for io_uring, and never
# in the io_uring pass; and it takes /run/lanefs-enable_uring.lock exclusively while the
# setting is off, which the io_uring pass below holds shared (as root), so that a run from
# another checkout on the same machine cannot turn it off under this one's io_uring pass.
# Without root, or while anything else may be mounting through io_uring, its tests skip with
# a message.
#
# LANEFS_KEEP_ENABLE_URING=1 (a machine shared with others, whose setting is not this run's
# to change) leaves fuse.enable_uring as it is: the script does not turn it on, the io_uring
# pass runs only if it is on already, and the tests of uring_unavailable.rs that would change
# it skip with a message.
#
# A failure stops nothing: each pass runs every test binary (--no-fail-fast), the io_uring
# pass runs after a failed first pass too, and the script exits non-zero at the end, naming
# the passes that failed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
    if ! command -v fusermount3 >/dev/null 2>&1 ||
        ! { command -v mount.fuse3 || [ -x /sbin/mount.fuse3 ] || [ -x /usr/sbin/mount.fuse3 ]; } >/dev/null 2>&1; then
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "scripts/test.sh: fuse3 is missing and there is no apt-get: install fuse3 (fusermount3, mount.fuse3)" >&2
            exit 1
        fi
        echo "scripts/test.sh: installing fuse3 (apt-get)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq fuse3 >/dev/null
    fi
    # stress-ng, whose filesystem stressors cli/tests/run.rs runs under `lanefs run`.
    if ! command -v stress-ng >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test.sh: installing stress-ng (apt-get)" >&2
        export DEBIAN_FRONTEND=noninteractive
        { apt-get install -y -qq stress-ng || { apt-get update -qq && apt-get install -y -qq stress-ng; }; } >/dev/null
    fi
    command -v stress-ng >/dev/null 2>&1 && export LANEFS_REQUIRE_STRESS_NG=1
    cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
    pjdfstest="${LANEFS_PJDFSTEST:-}"
    if [ -z "$pjdfstest" ] || [ ! -x "$pjdfstest" ]; then
        pjdfstest="$(command -v pjdfstest || true)"
    fi
    if [ -z "$pjdfstest" ] && [ -x "$cargo_bin/pjdfstest" ]; then
        pjdfstest="$cargo_bin/pjdfstest"
    fi
    if [ -z "$pjdfstest" ]; then
        echo "scripts/test.sh: installing pjdfstest 0.2.2 (cargo install)" >&2
        cargo install --quiet --locked pjdfstest --version 0.2.2
        pjdfstest="$(command -v pjdfstest || echo "$cargo_bin/pjdfstest")"
    fi
    export LANEFS_PJDFSTEST="$pjdfstest"
    export LANEFS_REQUIRE_PJDFSTEST=1
else
    echo "scripts/test.sh: not root: installing nothing; the tests that need root skip" >&2
fi

uring_param=/sys/module/fuse/parameters/enable_uring
uring_lock=/run/lanefs-enable_uring.lock
keep_uring=
if [ -n "${LANEFS_KEEP_ENABLE_URING:-}" ] && [ "${LANEFS_KEEP_ENABLE_URING}" != 0 ]; then
    keep_uring=1
fi
if [ "$(id -u)" = 0 ] && [ -e "$uring_param" ] && [ -z "$keep_uring" ]; then
    echo Y > "$uring_param"
fi

failed=()
echo "scripts/test.sh: pass 1: every test, mounts served through /dev/fuse" >&2
if ! LANEFS_URING=off cargo test --workspace --locked --no-fail-fast "$@"; then
    failed+=("pass 1 (/dev/fuse)")
    echo "scripts/test.sh: pass 1 FAILED; going on with the io_uring pass" >&2
fi

# The io_uring pass holds $uring_lock shared on descriptor 9 (closed for the commands it
# runs, so that no server they leave running keeps it), and turns the setting on again
# under it.
if [ "$(id -u)" = 0 ] && [ -e "$uring_param" ] && command -v flock >/dev/null 2>&1; then
    exec 9>>"$uring_lock"
    flock -s 9
    if [ -z "$keep_uring" ]; then
        echo Y > "$uring_param"
    fi
fi
if [ -e "$uring_param" ] && [ "$(cat "$uring_param")" = Y ]; then
    echo "scripts/test.sh: pass 2: the mount suites, served through io_uring" >&2
    # `--workspace` with test names, not `-p lanefs-fuse -p lanefs-cli`: selecting
    # packages resolves the dependencies' features anew and rebuilds them (about two
    # minutes on two CPUs); the workspace reuses pass 1's binaries. The names also pick
    # engine/tests/{stress,memory}.rs, which mount nothing (a few seconds).
    if ! LANEFS_URING=on cargo test --workspace --locked --no-fail-fast --test mount --test dircache \
        --test stress --test handoff --test listing_races --test cli \
        --test crash --test memory --test run "$@" 9>&-; then
        failed+=("pass 2 (io_uring)")
    fi
elif [ -e "$uring_param" ] && [ -n "$keep_uring" ]; then
    echo "scripts/test.sh: io_uring pass SKIPPED: fuse.enable_uring is off and LANEFS_KEEP_ENABLE_URING says to leave it so" >&2
elif [ -e "$uring_param" ]; then
    echo "scripts/test.sh: io_uring pass SKIPPED: fuse.enable_uring is off and only root can turn it on" >&2
else
    echo "scripts/test.sh: io_uring pass SKIPPED: this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)" >&2
fi

if [ "${#failed[@]}" -gt 0 ]; then
    printf -v list '%s, ' "${failed[@]}"
    echo "scripts/test.sh: FAILED: ${list%, }" >&2
    exit 1
fi
echo "scripts/test.sh: every pass that ran passed" >&2
