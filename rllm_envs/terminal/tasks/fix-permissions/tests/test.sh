#!/bin/bash
# Verifier for the `fix-permissions` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ "$(sha256sum < /app/scripts/build.sh | cut -d" " -f1)" = "6296f07ca310d63a6f7adb30390e169cd020c7648a12b42c73f00cb5ba7b37b0" ] || fail "/app/scripts/build.sh content changed"
[ "$(sha256sum < /app/scripts/deploy.sh | cut -d" " -f1)" = "7a7b8bb839f366dd732968361b0d5fc21790cd3c7c3ae69908328738be43c113" ] || fail "/app/scripts/deploy.sh content changed"
[ "$(sha256sum < /app/scripts/lib/helpers.sh | cut -d" " -f1)" = "ac84a3535f07862919fb4bf641127c908778e3c337cef9f24329a550bbadcf61" ] || fail "/app/scripts/lib/helpers.sh content changed"
[ "$(sha256sum < /app/scripts/README.txt | cut -d" " -f1)" = "88f53d03a57ac71e24d4abf8ebd2d3f959cbc91ed035ce9fb387b41bcee28985" ] || fail "/app/scripts/README.txt content changed"
[ "$(sha256sum < /app/data/users.csv | cut -d" " -f1)" = "6c757685871b636e0982a62065459cefcc7f019b1c9b3f44b46c304484260873" ] || fail "/app/data/users.csv content changed"
[ "$(sha256sum < /app/data/orders.csv | cut -d" " -f1)" = "0e96f5383bd9ccbee267bb4d0491c055dd5f80cdd7ea3813d247e891ecc119f1" ] || fail "/app/data/orders.csv content changed"
[ "$(sha256sum < /app/private/token.txt | cut -d" " -f1)" = "7a40e45ceb766ede691c80149453897de2a3573f89ac712055cabfa5879dcab5" ] || fail "/app/private/token.txt content changed"
for f in /app/scripts/build.sh /app/scripts/deploy.sh /app/scripts/lib/helpers.sh; do
    [ "$(( 0$(stat -c %a "$f") & 0100 ))" -ne 0 ] || fail "$f is not executable by its owner"
done
[ "$(( 0$(stat -c %a /app/scripts/README.txt) & 0111 ))" -eq 0 ] || fail "README.txt must not be executable"
for f in /app/data/users.csv /app/data/orders.csv; do
    [ "$(( 0$(stat -c %a "$f") & 0111 ))" -eq 0 ] || fail "$f must not be executable"
done
[ "$(stat -c %a /app/private/token.txt)" = "600" ] || fail "token.txt mode is $(stat -c %a /app/private/token.txt), not 600"
[ "$(stat -c %a /app/private)" = "700" ] || fail "/app/private mode is $(stat -c %a /app/private), not 700"

echo PASS
verdict 1
}
