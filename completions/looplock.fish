# fish completion for looplock(1): options, the values of -p/--policy and
# --log-format, files and directories where an option takes one, DIR as a
# directory (several with --inspect), and after "--" the command and its
# arguments.

# Options that take a value (skipped when looking for DIR).
set -g __looplock_value_opts -p --policy -w --timeout -E --conflict-exit-code --skip-exit-code \
    --agent --operation --log-format --kill-after --max-time --warn-before --warn-signal --once-per --jitter \
    --metrics-dir --notify --notify-on --notify-timeout --notify-after --holders --tied-to --stale-after --incidents --etcd \
    --lock-name --ttl --etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file

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

complete -c looplock -n $opts -s h -l help -d 'Show help'
complete -c looplock -n $opts -s V -l version -d 'Show version'
complete -c looplock -n $opts -s p -l policy -x -d 'How to wait for the lock' -a '
    mutation\t"wait up to 5 s, else exit 75 (default)"
    monitor\t"wait up to 1 s, else exit 75"
    single_flight\t"do not wait: skip the command and exit 0"
    blocking\t"wait without limit"
    coalesce\t"one waiter per --operation; later runs join it and skip"'
complete -c looplock -n $opts -s w -l timeout -x -d 'Deadline for mutation/monitor/coalesce (a duration)'
complete -c looplock -n $opts -s n -l nonblock -d 'One attempt: -w 0 (as flock -n)'
complete -c looplock -n $opts -s E -l conflict-exit-code -x -d 'Status when the deadline passes (default 75)'
complete -c looplock -n $opts -l skip-exit-code -x -d 'Status of a skip: single_flight, coalesce (default 0)'
complete -c looplock -n $opts -s s -l shared -d 'Take a shared (reader) lock'
complete -c looplock -n $opts -s x -l exclusive -d 'Take an exclusive lock (the default)'
complete -c looplock -n $opts -l holders -x -d 'Let up to N runs (2-1024) hold the lock at once'
complete -c looplock -n $opts -s o -l close -d 'Do not pass the lock fd to COMMAND'
complete -c looplock -n $opts -s F -l no-fork -d 'Exec COMMAND in place of looplock'
complete -c looplock -n $opts -l kill-after -x -d 'Send KILL if a forwarded TERM/INT has not ended COMMAND'
complete -c looplock -n $opts -l max-time -x -d 'Terminate COMMAND once it has run this long (exit 124)'
complete -c looplock -n $opts -l warn-before -x -d "Signal the job DURATION before --max-time's TERM (or a failing lease's)"
complete -c looplock -n $opts -l warn-signal -x -a 'USR1 USR2 HUP INT TERM QUIT ALRM WINCH' -d 'The signal of --warn-before (default USR1)'
complete -c looplock -n $opts -l once-per -x -d 'Run at most once per DURATION (a run ledger)'
complete -c looplock -n $opts -l jitter -x -d 'Wait a random time below DURATION first'
complete -c looplock -n $opts -l hold -d 'Take the lock in a detached holder; print LOOPLOCK_HOLD=VALUE'
complete -c looplock -n $opts -l tied-to -x -a '(__fish_complete_pids)' -d 'With --hold: end the hold when PID exits'
complete -c looplock -n $opts -l release -d 'End the hold $LOOPLOCK_HOLD (or VALUE) names'
complete -c looplock -n $opts -l force -d 'With --release DIR: end the hold the kernel confirms'
complete -c looplock -n $opts -l agent -x -d 'Who runs it'
complete -c looplock -n $opts -l operation -x -d 'What runs'
complete -c looplock -n $opts -l notify -x -a '(__fish_complete_command)' -d 'Run COMMAND (sh -c) for each event, its JSON on stdin'
complete -c looplock -n $opts -l notify-on -x -d 'Events to notify, comma-separated (default: warnings, errors, held_too_long)'
complete -c looplock -n $opts -l notify-timeout -x -d 'KILL a notifier after DURATION (default 10s)'
complete -c looplock -n $opts -l notify-after -x -d 'held_too_long once the job has run DURATION'
complete -c looplock -n $opts -l metrics-dir -x -a '(__fish_complete_directories (commandline -ct) "metrics directory")' -d 'Write a node_exporter textfile per lock into DIR'
complete -c looplock -n $opts -s v -l verbose -d 'Report waiting, acquiring and releasing'
complete -c looplock -n $opts -s q -l quiet -d 'Errors only'
complete -c looplock -n $opts -l log-format -x -d 'Format of the stderr lines' -a '
    text\t"looplock: ... lines (default)"
    json\t"one JSON object per line"'
complete -c looplock -n $opts -l inspect -d 'Report who holds the lock of DIR; change nothing'
complete -c looplock -n $opts -l json -d 'With --inspect: print the report as JSON'
complete -c looplock -n $opts -l check -d 'With --inspect: exit 1 when a report carries a warning'
complete -c looplock -n $opts -l stale-after -x -d 'With --inspect: warn about holds older than this'
complete -c looplock -n $opts -l incidents -x -d 'With --inspect: show the newest N incident rows'
complete -c looplock -n $opts -l etcd -x -d 'Also lock across hosts on etcd (http://HOST:PORT,...)'
complete -c looplock -n $opts -l lock-name -x -d 'Cluster lock name (default: the base name of DIR)'
complete -c looplock -n $opts -l ttl -x -d 'etcd lease time to live in seconds (default 10)'
complete -c looplock -n $opts -l etcd-cacert -r -F -d 'CA certificates of the etcd servers'
complete -c looplock -n $opts -l etcd-cert -r -F -d 'Client certificate for etcd'
complete -c looplock -n $opts -l etcd-key -r -F -d 'Private key of the client certificate'
complete -c looplock -n $opts -l etcd-user -x -d 'etcd user name'
complete -c looplock -n $opts -l etcd-password-file -r -F -d "File holding the etcd user's password"
# --inspect takes no command, so no -c with it.
complete -c looplock -n "$opts; and not __looplock_inspect" -s c -x -d 'Run SHELL-COMMAND with /bin/sh -c'

# DIR (several with --inspect), then "--" or -c, then the command.
complete -c looplock -n '__looplock_needs_dir' -x -a '(__fish_complete_directories (commandline -ct) "loop directory")'
complete -c looplock -n 'not __looplock_needs_dir; and not __looplock_options_over; and not __looplock_inspect' -x -a '
    --\t"end of options: COMMAND follows"
    -c\t"SHELL-COMMAND follows"'
complete -c looplock -n '__looplock_after_dashdash; and not __looplock_inspect' -x -a '(__looplock_complete_command)'
