# bash completion for looplock(1)                          -*- shell-script -*-
#
# Completes looplock's options, the values of -p/--policy and --log-format,
# DIR as a directory, and after "--" the command and its arguments (through
# bash-completion's _command_offset when it is loaded, else command names and
# file names). Needs no other part of bash-completion.

_looplock()
{
    local cur prev i word
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=
    ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}

    local value_opts='-p --policy -w --timeout -E --conflict-exit-code --skip-exit-code --agent --operation --log-format --kill-after --stale-after --etcd --lock-name --ttl --etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file'

    # Find "--" (the command follows), "-c" (a shell command follows) and
    # whether DIR has been given, skipping the values of value options.
    local have_dir=0 skip=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if ((skip)); then
            skip=0
            continue
        fi
        case $word in
            --)
                _looplock_command $((i + 1))
                return 0
                ;;
            -c)
                # The shell command is one quoted word: nothing to offer.
                return 0
                ;;
            --*=*) ;;
            -*)
                case " $value_opts " in
                    *" $word "*) skip=1 ;;
                esac
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

    # The value of an option ("-p x", "--policy x", "--policy=x").
    local opt=$prev val=$cur
    if [[ $cur == --*=* ]]; then
        opt=${cur%%=*}
        val=${cur#*=}
    elif [[ $prev == = ]] && ((COMP_CWORD >= 2)); then
        opt=${COMP_WORDS[COMP_CWORD - 2]}
    elif [[ $cur == = ]]; then
        opt=$prev
        val=
    fi
    local values=
    case $opt in
        -p | --policy) values='mutation monitor single_flight blocking' ;;
        --log-format) values='text json' ;;
        --etcd-cacert | --etcd-cert | --etcd-key | --etcd-password-file)
            if [[ $opt == "$prev" || $cur == --*=* || $prev == = || $cur == = ]]; then
                mapfile -t COMPREPLY < <(compgen -f -- "$val")
                return 0
            fi
            ;;
        -w | --timeout | -E | --conflict-exit-code | --skip-exit-code | --agent | --operation | --kill-after | --stale-after | --etcd | --lock-name | --ttl | --etcd-user)
            if [[ $opt == "$prev" || $cur == --*=* || $prev == = || $cur == = ]]; then
                COMPREPLY=()
                return 0
            fi
            ;;
    esac
    if [[ -n $values && ( $opt == "$prev" || $cur == --*=* || $prev == = || $cur == = ) ]]; then
        local prefix=
        [[ $cur == --*=* ]] && prefix="$opt="
        mapfile -t COMPREPLY < <(compgen -P "$prefix" -W "$values" -- "$val")
        return 0
    fi

    if [[ $cur == -* ]]; then
        local opts='-h --help -V --version -p --policy -w --timeout -E --conflict-exit-code
            --skip-exit-code -s --shared -o --close -F --no-fork --kill-after --agent
            --operation -v --verbose -q --quiet --log-format --inspect --json
            --stale-after --etcd --lock-name --ttl --etcd-cacert --etcd-cert --etcd-key
            --etcd-user --etcd-password-file -c --'
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return 0
    fi

    if ((have_dir)); then
        # After DIR: the command goes after "--", or a shell command after -c.
        mapfile -t COMPREPLY < <(compgen -W '-- -c' -- "$cur")
        return 0
    fi

    # DIR: a directory.
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
