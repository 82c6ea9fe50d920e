package shim

// Device types other than krbd. A StorageClass with `mounter: rbd-nbd` makes ceph-csi run
// `rbd ... map IMAGE --device-type nbd` to stage a volume and, to re-attach one after its node
// plugin restarted, `rbd-nbd ... attach IMAGE --device /dev/nbdN` by name. Neither mapping is a
// krbd mapping the agent makes and claims, so the drop-in `rbd` refuses a map or attach through
// any device type but krbd (Ceph's rbd would run rbd-nbd from its own directory, past any PATH),
// and the drop-in `rbd-nbd` refuses map and attach. Every other command runs Ceph's program, so
// that nbd mappings made before rbd-owner can still be listed, detached and unmapped.
//
// Both programs may take options before their command, and this package does not know every
// option (Ceph's configuration options are accepted too): the word after an unknown option is
// read as a command word when it is one of those that start a refused command (so that no
// reading of the line hides a map), and as the option's value otherwise.

import (
	"fmt"
	"strings"
)

// refusal is the one line both drop-ins print when they refuse a map or attach through a
// device type other than krbd: what was refused, why, and what to do.
func refusal(what, deviceType, spec string) string {
	if spec != "" {
		what += " of " + spec
	}
	next := "map it with the default device type, krbd"
	if deviceType == "nbd" {
		next = "remove `mounter: rbd-nbd` from the StorageClass (use the default krbd mounter; a volume provisioned with it keeps it in its PersistentVolume)"
	}
	return "rbd-owner: refused: " + what + ": this node's rbd-owner protects RWO images only through krbd mappings it makes; " + next
}

// exitFailure is what rbd-nbd exits with on every failure (EXIT_FAILURE).
const exitFailure = 1

// RunNBD runs one `rbd-nbd` command line (args without the program name): map and attach are
// refused, anything else runs Ceph's rbd-nbd with the same arguments, streams and exit status.
func RunNBD(args []string, env Env) int {
	w := leadingWords(args, nbdOption, map[string]bool{"map": true, "attach": true}, false)
	if len(w) > 0 && (w[0] == "map" || w[0] == "attach") {
		fmt.Fprintln(env.Stderr, refusal("rbd-nbd "+w[0], "nbd", first(w[1:])))
		return exitFailure
	}
	return execReal("rbd-nbd", env.RealRBDNBD, "RBD_OWNER_REAL_RBD_NBD", args, env)
}

// rbdCommandWords start the rbd commands that are refused or handled: map, device map,
// device attach, and the older nbd map.
var rbdCommandWords = map[string]bool{"map": true, "device": true, "attach": true, "nbd": true}

// nonKrbdRefusal is the refusal of an rbd command line that maps or attaches through a device
// type other than krbd, "" for any other.
func nonKrbdRefusal(args []string) string {
	w := leadingWords(args, rbdOption, rbdCommandWords, true)
	var cmd string
	switch {
	case len(w) > 0 && w[0] == "map":
		cmd, w = "map", w[1:]
	case len(w) > 1 && w[0] == "device" && (w[1] == "map" || w[1] == "attach"):
		cmd, w = "device "+w[1], w[2:]
	case len(w) > 1 && w[0] == "nbd" && w[1] == "map":
		// Ceph's older spelling of `device map -t nbd` (hidden from its help where still accepted)
		return refusal("rbd nbd map", "nbd", first(w[2:]))
	default:
		return ""
	}
	t := nonKrbdType(args)
	if t == "" {
		return ""
	}
	return refusal("rbd "+cmd+" --device-type "+t, t, first(w))
}

// hiddenKrbdMap is the refusal of an rbd command line that Ceph's rbd may read as a krbd map
// although parse did not: parse takes an option it does not know for a flag, so the word after
// it, which Ceph's rbd may take for the option's value, hid the map; or parse failed. Passed to
// Ceph's rbd, such a map would be made without a claim. "" for any other.
func hiddenKrbdMap(args []string, c *cmdline, parseErr error) string {
	w := leadingWords(args, rbdOption, rbdCommandWords, true)
	if !(len(w) > 0 && w[0] == "map") && !(len(w) > 1 && w[0] == "device" && w[1] == "map") {
		return ""
	}
	switch {
	case parseErr != nil:
		return "rbd: map refused by rbd-owner: " + parseErr.Error()
	case c.command() == "map":
		return "" // parse read it as a map too: not hidden (a device type other than krbd is refused before)
	case len(c.unknown) > 0:
		return fmt.Sprintf("rbd: map refused by rbd-owner: option %s is not supported for a krbd map through rbd-owner", c.unknown[0])
	}
	return "rbd: map refused by rbd-owner: the command line is not understood as a krbd map through rbd-owner"
}

// nonKrbdType is the first device type other than krbd that an rbd command line names
// (--device-type T, --device-type=T, -t T, -tT, -t=T, anywhere), "" when none.
func nonKrbdType(args []string) string {
	for i := 0; i < len(args); i++ {
		a, t := args[i], ""
		switch {
		case a == "--device-type" || a == "-t":
			if i+1 < len(args) {
				i++
				t = args[i]
			}
		case strings.HasPrefix(a, "--device-type="):
			t = strings.TrimPrefix(a, "--device-type=")
		case strings.HasPrefix(a, "-t"):
			t = strings.TrimPrefix(strings.TrimPrefix(a, "-t"), "=")
		}
		if t != "" && t != "krbd" {
			return t
		}
	}
	return ""
}

// leadingWords is the positional words of a command line, in order. option says whether an
// option (its name, before any "=") is known and takes a value; the word after an unknown one
// is a positional word when it is in keep, the option's value otherwise. With dashdash, every
// word after "--" is positional (Ceph's rbd); without, "--" is dropped (rbd-nbd).
func leadingWords(args []string, option func(name string) (known, takesValue bool), keep map[string]bool, dashdash bool) []string {
	var words []string
	maybeValue := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			maybeValue = false
			if dashdash {
				return append(words, args[i+1:]...)
			}
			continue
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			maybeValue = false
			name, _, hasVal := strings.Cut(a, "=")
			known, takesValue := option(name)
			switch {
			case hasVal:
			case known && takesValue:
				i++ // its value
			case !known:
				maybeValue = true
			}
			continue
		}
		if maybeValue && !keep[a] {
			maybeValue = false
			continue // the unknown option's value
		}
		maybeValue = false
		words = append(words, a)
	}
	return words
}

// rbdOption knows the options of parse (valued, flagged), a short one with its value attached
// (-tnbd, -prbd), and help.
func rbdOption(name string) (known, takesValue bool) {
	if _, ok := valued[name]; ok {
		return true, true
	}
	if _, ok := flagged[name]; ok {
		return true, false
	}
	if _, ok := valued[name[:min(2, len(name))]]; ok && len(name) > 2 && name[1] != '-' {
		return true, false
	}
	return name == "-h" || name == "--help", false
}

// nbdOptions are rbd-nbd's options and the Ceph options it takes, by whether they take a value
// (long names with '-' for '_': Ceph's parser takes both).
var nbdOptions = map[string]bool{
	"--device": true, "--io-timeout": true, "--timeout": true, "--nbds-max": true, "--max-part": true,
	"--quiesce-hook": true, "--reattach-timeout": true, "--format": true, "--cookie": true, "--snap-id": true,
	"--encryption-format": true, "--encryption-passphrase-file": true,
	"--id": true, "-i": true, "--name": true, "-n": true, "--conf": true, "-c": true, "--cluster": true,
	"-m": true, "--mon-host": true, "--keyring": true, "-k": true, "--keyfile": true, "-K": true,
	"--log-file": true, "--admin-socket": true,
	"-h": false, "--help": false, "-v": false, "--version": false, "--quiesce": false, "--read-only": false,
	"--exclusive": false, "--notrim": false, "--pretty-format": false, "--try-netlink": false,
	"--show-cookie": false, "-f": false, "-d": false,
}

func nbdOption(name string) (known, takesValue bool) {
	if strings.HasPrefix(name, "--") {
		name = "--" + strings.ReplaceAll(name[2:], "_", "-")
	}
	takesValue, known = nbdOptions[name]
	return known, takesValue
}

func first(w []string) string {
	if len(w) == 0 {
		return ""
	}
	return w[0]
}
