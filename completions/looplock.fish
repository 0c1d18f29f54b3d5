# fish completion for looplock(1): options, the values of -p/--policy and
# --log-format, files and directories where an option takes one, DIR as a
# directory (several with --inspect), and after "--" the command and its
# arguments. Made by `looplock --completions fish` from its option table:
# edit that.

# Options that take a value (skipped when looking for DIR).
set -g __looplock_value_opts -p --policy -w --timeout -E --conflict-exit-code --skip-exit-code --holders \
    --kill-after --max-time --agent --operation --warn-before --warn-signal --once-per --jitter --tied-to \
    --log-format --metrics-dir --notify --notify-on --notify-timeout --notify-after --stale-after --incidents \
    --etcd --lock-name --ttl --etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file \
    --completions

# Whether the command line (before the cursor) has a "--" or "-c": then
# looplock's own options are over.
function __looplock_options_over
    set -l tokens (commandline -opc)
    contains -- -- $tokens; or contains -- -c $tokens
end

function __looplock_after_dashdash
    contains -- -- (commandline -opc)
end

function __looplock_inspect
    contains -- --inspect (commandline -opc)
end

# Whether a positional argument (DIR) has been given, skipping the values of
# the options that take one (also after a group such as -qp).
function __looplock_have_dir
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l skip 0
    for t in $tokens
        if test $skip -eq 1
            set skip 0
            continue
        end
        switch $t
            case -- -- -c
                return 1
            case '--*=*'
            case '--*'
                contains -- $t $__looplock_value_opts; and set skip 1
            case '-*'
                # -qp: the group's first value-taking letter is its last
                if string match -qr -- '^-[^pwE]*[pwE]$' $t
                    set skip 1
                end
            case '*'
                return 0
        end
    end
    return 1
end

# DIR is to be completed: none given yet, or one more for --inspect.
function __looplock_needs_dir
    not __looplock_options_over; or return 1
    __looplock_inspect; or not __looplock_have_dir
end

# Completes the command after "--" as a command line of its own.
function __looplock_complete_command
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l cmd
    if test $i -lt (count $tokens)
        set cmd (string escape -- $tokens[(math $i + 1)..-1])
    end
    complete -C (string join -- ' ' $cmd (commandline -ct))
end

complete -c looplock -f
set -l opts 'not __looplock_options_over'

complete -c looplock -n $opts -s p -l policy -x -a '
    mutation\t"wait up to 5 s, else exit 75 (default)"
    monitor\t"wait up to 1 s, else exit 75"
    single_flight\t"do not wait: skip the command and exit 0"
    blocking\t"wait without limit"
    coalesce\t"one waiter per --operation; later runs join it and skip"' -d 'how to wait for the lock'
complete -c looplock -n $opts -s w -l timeout -x -d 'deadline for mutation/monitor/coalesce'
complete -c looplock -n $opts -s n -l nonblock -d 'one attempt: -w 0 (as flock -n)'
complete -c looplock -n $opts -s E -l conflict-exit-code -x -d 'status when the deadline passes (default 75)'
complete -c looplock -n $opts -l skip-exit-code -x -d 'status of a skip: single_flight, coalesce (default 0)'
complete -c looplock -n $opts -s s -l shared -d 'take a shared (reader) lock'
complete -c looplock -n $opts -s x -l exclusive -d 'take an exclusive lock (the default)'
complete -c looplock -n $opts -l holders -x -d 'let up to N runs hold the lock at once'
complete -c looplock -n $opts -s o -l close -d 'do not pass the lock fd to COMMAND'
complete -c looplock -n $opts -s F -l no-fork -d 'exec COMMAND in place of looplock'
complete -c looplock -n $opts -l kill-after -x -d 'send KILL if a forwarded TERM/INT has not ended COMMAND'
complete -c looplock -n $opts -l max-time -x -d 'terminate COMMAND once it has run this long (exit 124)'
complete -c looplock -n $opts -l agent -x -d 'who runs it'
complete -c looplock -n $opts -l operation -x -d 'what runs'
complete -c looplock -n $opts -l warn-before -x -d 'signal the job DURATION before --max-time\'s TERM (or a failing lease\'s)'
complete -c looplock -n $opts -l warn-signal -x -a 'USR1 USR2 HUP INT TERM QUIT ALRM WINCH' -d 'the signal of --warn-before (default USR1)'
complete -c looplock -n $opts -l once-per -x -d 'run at most once per DURATION (a run ledger)'
complete -c looplock -n $opts -l jitter -x -d 'wait a random time below DURATION first'
complete -c looplock -n $opts -l hold -d 'take the lock in a detached holder; print LOOPLOCK_HOLD=VALUE'
complete -c looplock -n $opts -l tied-to -x -a '(__fish_complete_pids)' -d 'with --hold: end the hold when PID exits'
complete -c looplock -n $opts -l release -d 'end the hold $LOOPLOCK_HOLD or VALUE names'
complete -c looplock -n $opts -l force -d 'with --release DIR: end the hold the kernel confirms'
complete -c looplock -n $opts -s v -l verbose -d 'report waiting, acquiring and releasing'
complete -c looplock -n $opts -s q -l quiet -d 'errors only'
complete -c looplock -n $opts -l log-format -x -a '
    text\t"looplock: ... lines (default)"
    json\t"one JSON object per line"' -d 'format of the stderr lines'
complete -c looplock -n $opts -l metrics-dir -x -a '(__fish_complete_directories (commandline -ct) "metrics directory")' -d 'write a node_exporter textfile per lock into DIR'
complete -c looplock -n $opts -l notify -x -a '(__fish_complete_command)' -d 'run COMMAND (sh -c) for each event, its JSON on stdin'
complete -c looplock -n $opts -l notify-on -x -d 'events to notify, comma-separated (default: warnings, errors, held_too_long)'
complete -c looplock -n $opts -l notify-timeout -x -d 'KILL a notifier after DURATION (default 10s)'
complete -c looplock -n $opts -l notify-after -x -d 'held_too_long once the job has run DURATION'
complete -c looplock -n $opts -l inspect -d 'report who holds the lock of DIR; change nothing'
complete -c looplock -n $opts -l json -d 'with --inspect: print the report as one JSON object'
complete -c looplock -n $opts -l check -d 'with --inspect: exit 1 when a report carries a warning'
complete -c looplock -n $opts -l stale-after -x -d 'with --inspect: warn about holds older than this'
complete -c looplock -n $opts -l incidents -x -d 'with --inspect: show the newest N incident rows'
complete -c looplock -n $opts -l etcd -x -d 'also lock across hosts on etcd'
complete -c looplock -n $opts -l lock-name -x -d 'cluster lock name (default: the base name of DIR)'
complete -c looplock -n $opts -l ttl -x -d 'etcd lease time to live in seconds (default 10)'
complete -c looplock -n $opts -l etcd-cacert -r -F -d 'CA certificates that sign the etcd servers\' certificates'
complete -c looplock -n $opts -l etcd-cert -r -F -d 'client certificate for etcd'
complete -c looplock -n $opts -l etcd-key -r -F -d 'private key of the client certificate'
complete -c looplock -n $opts -l etcd-user -x -d 'etcd user name'
complete -c looplock -n $opts -l etcd-password-file -r -F -d 'file holding the etcd user\'s password'
complete -c looplock -n $opts -l completions -x -a 'bash zsh fish' -d 'print the completion script for SHELL'
complete -c looplock -n $opts -s h -l help -d 'show help'
complete -c looplock -n $opts -s V -l version -d 'show version'
# --inspect takes no command, so no -c with it.
complete -c looplock -n "$opts; and not __looplock_inspect" -s c -x -d 'Run SHELL-COMMAND with /bin/sh -c'

# DIR (several with --inspect), then "--" or -c, then the command.
complete -c looplock -n '__looplock_needs_dir' -x -a '(__fish_complete_directories (commandline -ct) "loop directory")'
complete -c looplock -n 'not __looplock_needs_dir; and not __looplock_options_over; and not __looplock_inspect' -x -a '
    --\t"end of options: COMMAND follows"
    -c\t"SHELL-COMMAND follows"'
complete -c looplock -n '__looplock_after_dashdash; and not __looplock_inspect' -x -a '(__looplock_complete_command)'
