#!/bin/bash
# Verifier for the `group-sum` task: judges ONLY the end state of files under /app (never the agent's words)
# and writes 1 (pass) or 0 (fail) to /logs/verifier/reward.txt. The verdict is written last (0 on any failed
# check, and 0 first so that a crash scores 0), and the whole script is one { } block, which bash parses
# completely before running it: a program under test cannot rewrite the rest of this file, and a reward it
# writes itself is overwritten by the verdict.
{
# --- judge preamble: identical in every built-in task's tests/test.sh (source: rllm_envs/terminal/judge_preamble.sh)
# This script is the judge. It never runs agent code itself: every program the agent wrote or touched (its
# scripts, modules, Makefile, git repository) runs through `untrusted`, where /tests and /logs are empty, no
# capability is left and nothing outlives the call. What comes back is data (output, files, an exit status that
# can only fail a check); the verdict is this script's alone, written last.
set -u
umask 022
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C PYTHONNOUSERSITE=1
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONSAFEPATH BASH_ENV ENV CDPATH GIT_DIR GIT_WORK_TREE LD_PRELOAD
chmod u+rwx /tests /logs 2>/dev/null  # an agent's `chmod 000 /tests /logs` must not turn into a sandbox error
[ -d /logs ] && [ ! -L /logs ] || { rm -rf /logs; mkdir -p /logs; }
rm -rf /logs/verifier /logs/judge && mkdir -p /logs/verifier /logs/judge && chmod 700 /logs/judge
export HOME=/logs/judge  # the judge's own home and working directory, hidden from agent code like /logs
cd "$HOME" || exit 2
echo 0 > /logs/verifier/reward.txt
verdict() { rm -rf /logs/verifier; mkdir -p /logs/verifier; echo "$1" > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; verdict 0; }
untrusted() {  # untrusted CMD ARGS...: run agent code apart from the judge; its status and output are returned
    if unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc true 2>/dev/null; then
        # own user, mount and pid namespaces: /tests and /logs covered by empty tmpfs, every capability dropped
        # (the covers cannot be lifted), and the namespace's processes all die when the command ends
        unshare --user --map-root-user --mount --pid --fork --kill-child --mount-proc -- /bin/sh -c \
            'mount -t tmpfs -o size=16k rllm-hidden /tests && mount -t tmpfs -o size=16k rllm-hidden /logs ||
             exit 125; cd "$PWD" 2>/dev/null || cd /  # a cwd under a covered folder would still reach it
             exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all -- "$@"' untrusted "$@"
    elif [ "$(id -u)" = 0 ] && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
        # no user namespaces (Docker's default seccomp): another uid, for which /tests and /logs are closed
        chmod 700 /tests /logs && chown -R 65534:65534 /app /tmp || exit 2
        cd "$PWD" 2>/dev/null || cd /
        setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all \
            -- "$@"
        set -- $?
        setpriv --reuid=65534 --regid=65534 --clear-groups -- /bin/bash -c 'kill -9 -1' 2>/dev/null
        return "$1"
    else
        echo "the verifier cannot run agent code apart from itself here (no user namespace, not root)"
        rm -rf /logs/verifier; exit 2  # no reward file: a verifier error, never a verdict
    fi
}
# --- end of the judge preamble
[ -f /app/totals.csv ] || fail "/app/totals.csv does not exist"
diff <(sed -e 's/\r$//' -e '$a\' /app/totals.csv) /tests/expected.csv || fail "wrong totals"

echo PASS
verdict 1
}
