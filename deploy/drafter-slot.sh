#!/bin/sh
# Runs `specd ARGS...` as one drafter replica of several on the host network (compose.host.yaml):
# claims the first free loopback address of SPECD_DRAFTER_SLOTS and rewrites the host of
# --listen and --metrics-listen to it, so replicas of one service do not collide on the
# host's ports. The claim is a lock on SPECD_DRAFTER_SLOT_DIR/<address>, held by specd itself
# (the descriptor survives the exec) and released by the kernel when the replica stops,
# however it stops; two replicas starting at once cannot take the same address.
set -eu
dir=${SPECD_DRAFTER_SLOT_DIR:-/run/specd-slots}
slots=${SPECD_DRAFTER_SLOTS:?SPECD_DRAFTER_SLOTS lists the addresses replicas may claim}
for ip in $slots; do
    exec 9>"$dir/$ip"
    if flock -n 9; then
        # For the health check, which must probe this replica's address.
        echo "$ip" >/tmp/specd-slot
        for arg; do
            shift
            case $arg in
            --listen=*:* | --metrics-listen=*:*) arg="${arg%%=*}=$ip:${arg##*:}" ;;
            esac
            set -- "$@" "$arg"
        done
        echo "drafter-slot: listening on $ip" >&2
        exec specd "$@"
    fi
    exec 9>&-
done
echo "drafter-slot: every address of SPECD_DRAFTER_SLOTS ($slots) is taken by another replica" >&2
exit 1
