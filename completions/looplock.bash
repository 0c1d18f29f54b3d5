# bash completion for looplock(1)                          -*- shell-script -*-
# Made by `looplock --completions bash` from its option table: edit that.
#
# Completes looplock's options, the values of -p/--policy and --log-format
# (also after a group of short options such as -qp), files and directories
# where an option takes one, DIR as a directory (several with --inspect),
# and after "--" the command and its arguments (through bash-completion's
# _command_offset when it is loaded, else command names and file names).
# Needs no other part of bash-completion.

# Options that take a value (the next word, or "--opt=value"), and the short
# options among them (a group like -qp ends with one).
_looplock_value_opts='-p --policy -w --timeout -E --conflict-exit-code --skip-exit-code --holders --kill-after
    --max-time --agent --operation --warn-before --warn-signal --once-per --jitter --tied-to --log-format
    --metrics-dir --notify --notify-on --notify-timeout --notify-after --stale-after --incidents --etcd
    --lock-name --ttl --etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file --completions'
_looplock_value_shorts=pwE

# The option whose value a word is, for a word "-qp" (a group of short
# options ending in one that takes a value): "-p"; for "--policy": itself;
# else nothing.
_looplock_value_opt()
{
    local word=$1
    case $word in
        --*=* | -) return 1 ;;
        --*)
            case " ${_looplock_value_opts//$'\n'/ } " in
                *" $word "*) printf '%s\n' "$word" ;;
                *) return 1 ;;
            esac
            ;;
        -*)
            # The first value-taking letter of the group decides: it takes the
            # rest of the word, or (when it is last) the next word.
            local i c
            for ((i = 1; i < ${#word}; i++)); do
                c=${word:i:1}
                if [[ $_looplock_value_shorts == *"$c"* ]]; then
                    ((i == ${#word} - 1)) && printf -- '-%s\n' "$c" && return 0
                    return 1
                fi
            done
            return 1
            ;;
        *) return 1 ;;
    esac
}

_looplock()
{
    local cur prev i word
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=
    ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}

    # Find "--" (the command follows), "-c" (a shell command follows),
    # --inspect, and whether DIR has been given, skipping the values of value
    # options.
    local have_dir=0 skip=0 inspect=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if ((skip)); then
            skip=0
            continue
        fi
        case $word in
            --)
                ((inspect)) && return 0  # --inspect takes no command
                _looplock_command $((i + 1))
                return 0
                ;;
            -c)
                # The shell command is one quoted word: nothing to offer.
                return 0
                ;;
            --inspect) inspect=1 ;;
            --*=*) ;;
            -*)
                _looplock_value_opt "$word" >/dev/null && skip=1
                ;;
            =)  # "--policy=x" split at "=" by COMP_WORDBREAKS
                ;;
            *)
                # a value after "--opt =" (split at "="), else DIR
                if [[ ${COMP_WORDS[i - 1]} != = ]]; then
                    have_dir=1
                fi
                ;;
        esac
    done

    # The value of an option ("-p x", "-qp x", "--policy x", "--policy=x").
    local opt= val=$cur prefix=
    if [[ $cur == --*=* ]]; then
        opt=${cur%%=*}
        val=${cur#*=}
        prefix="$opt="
    elif [[ $prev == = ]] && ((COMP_CWORD >= 2)); then
        opt=${COMP_WORDS[COMP_CWORD - 2]}
    elif [[ $cur == = ]]; then
        opt=$prev
        val=
    elif [[ $cur == -[!-]* ]] && ! _looplock_value_opt "$cur" >/dev/null; then
        # "-pmon", "-qpmon": a short option's value attached to it.
        local j
        for ((j = 1; j < ${#cur}; j++)); do
            if [[ $_looplock_value_shorts == *"${cur:j:1}"* ]]; then
                opt=-${cur:j:1}
                prefix=${cur:0:j+1}
                val=${cur:j+1}
                break
            fi
        done
    else
        opt=$(_looplock_value_opt "$prev")
    fi
    if [[ -n $opt ]]; then
        case $opt in
            -p | --policy)
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -W 'mutation monitor single_flight blocking coalesce' -- "$val")
                ;;
            --warn-signal)
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -W 'USR1 USR2 HUP INT TERM QUIT ALRM WINCH' -- "$val")
                ;;
            --log-format)
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -W 'text json' -- "$val")
                ;;
            --completions)
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -W 'bash zsh fish' -- "$val")
                ;;
            --metrics-dir)
                compopt -o filenames 2>/dev/null
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -d -- "$val")
                ;;
            --etcd-cacert | --etcd-cert | --etcd-key | --etcd-password-file)
                compopt -o filenames 2>/dev/null
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -f -- "$val")
                ;;
            --tied-to)
                mapfile -t COMPREPLY < <(compgen -P "$prefix" -W "$(cd /proc 2>/dev/null && printf '%s ' [0-9]*)" -- "$val")
                ;;
            *)
                # a number, a duration, a name or endpoints: nothing to offer
                COMPREPLY=()
                ;;
        esac
        return 0
    fi

    if [[ $cur == -* ]]; then
        local opts='-p --policy -w --timeout -n --nonblock -E --conflict-exit-code --skip-exit-code -s
            --shared -x --exclusive --holders -o --close -F --no-fork --kill-after --max-time --agent
            --operation --warn-before --warn-signal --once-per --jitter --hold --tied-to --release --force -v
            --verbose -q --quiet --log-format --metrics-dir --notify --notify-on --notify-timeout
            --notify-after --inspect --json --check --stale-after --incidents --etcd --lock-name --ttl
            --etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file --completions -h --help -V
            --version'
        # --inspect takes no command: neither "--" nor -c.
        ((inspect)) || opts+=' -c --'
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return 0
    fi

    if ((have_dir && !inspect)); then
        # After DIR: the command goes after "--", or a shell command after -c.
        mapfile -t COMPREPLY < <(compgen -W '-- -c' -- "$cur")
        return 0
    fi

    # DIR (with --inspect, one more DIR): a directory.
    compopt -o filenames 2>/dev/null
    mapfile -t COMPREPLY < <(compgen -d -- "$cur")
    return 0
}

# Completes the command that starts at word $1 and its arguments.
_looplock_command()
{
    local offset=$1
    if declare -F _comp_command_offset >/dev/null; then
        _comp_command_offset "$offset"
    elif declare -F _command_offset >/dev/null; then
        _command_offset "$offset"
    else
        local cur=${COMP_WORDS[COMP_CWORD]}
        if ((COMP_CWORD == offset)); then
            mapfile -t COMPREPLY < <(compgen -c -- "$cur")
        else
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
    fi
}

complete -F _looplock looplock

# ex: filetype=sh
