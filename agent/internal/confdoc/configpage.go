package confdoc

import (
	"fmt"
	"io"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/config"
	"github.com/rbd-owner/rbd-owner/agent/internal/manpage"
)

// The pages' file names, as `__gendocs` writes them.
const (
	ConfigPageFile = "rbd-owner.yaml.5"
	AgentPageFile  = "rbd-owner-agent.8"
)

// DocDir is where the packages install README.md and docs/.
const DocDir = "/usr/share/doc/rbd-owner"

// Example is the configuration the page shows (a test parses it).
const Example = `clusters:
  - id: ceph-a
    monitors: [10.0.0.1:6789, 10.0.0.2:6789, 10.0.0.3:6789]
    user: rbd-owner
    keyring: /etc/ceph/ceph.client.rbd-owner.keyring
takeover_policy: after-fence
metrics_listen: "10.0.0.5:9283"
`

// ConfigPage writes rbd-owner.yaml(5): how the agent reads its config file, and each key from
// config.Keys with its type, default, what it accepts and what it means. date and source are
// the page's footer (the build's date, "rbd-owner 0.1.0").
func ConfigPage(w io.Writer, date, source string) error {
	var b strings.Builder
	b.WriteString(manpage.Header("rbd-owner.yaml", "configuration file of the rbd-owner node agent",
		manpage.Page{Section: "5", Date: date, Source: source}))
	b.WriteString(".SH SYNOPSIS\n" + manpage.Inline(config.DefaultPath) + "\n")
	section(&b, "DESCRIPTION", configDescription()...)
	b.WriteString(".SH KEYS\n")
	var perCluster []config.Key
	for _, k := range config.Keys() {
		if name, ok := strings.CutPrefix(k.Name, config.ClustersPrefix); ok {
			k.Name = name
			perCluster = append(perCluster, k)
			continue
		}
		keyEntry(&b, k)
	}
	b.WriteString(".SS \"Keys of each cluster\"\n")
	paragraphs(&b, "Each entry of `clusters` is a mapping with these keys:")
	for _, k := range perCluster {
		keyEntry(&b, k)
	}
	section(&b, "THE LEASE BOUND", leaseBound()...)
	b.WriteString(".SH EXAMPLE\n.PP\n.RS\n.nf\n")
	for _, line := range strings.Split(strings.TrimSuffix(Example, "\n"), "\n") {
		b.WriteString(manpage.Escape(line) + "\n")
	}
	b.WriteString(".fi\n.RE\n")
	b.WriteString(".SH FILES\n")
	item(&b, "`"+config.DefaultPath+"`", "The configuration the agent reads; the packaged one lists every key, commented, with its default.")
	item(&b, "`"+DocDir+"/docs/configuration.md`", "The keys in a table, the reasons for the lease bound, and how to check a config.")
	section(&b, "SEE ALSO", "`rbd-owner-agent`(8), `rbd-owner`(8), `systemctl`(1)")
	_, err := io.WriteString(w, b.String())
	return err
}

func configDescription() []string {
	return []string{
		"The rbd-owner node agent, `rbd-owner-agent`(8), which `rbd-owner daemon` starts, reads its " +
			"configuration from `" + config.DefaultPath + "` when it starts (`--config PATH` names another " +
			"file): a change takes effect at the next start, `systemctl restart rbd-owner`. The packaged file " +
			"is a conffile, which upgrades keep once it is edited.",
		"The file is a YAML mapping, one `key: value` per line. Only `clusters` must be there; a key left " +
			"out, or set to null, takes its default. A duration is a number and a unit, `ms`, `s`, `m` or " +
			"`h`: `90s`, `5m`, `1h30m` (there are no days: a week is `168h`). A list is written `[a, b]`, " +
			"or one `- a` per line.",
		"The agent refuses a file with an unknown key, a key set twice or a value the key does not accept, " +
			"and does not start. Its error is one line that names the file, the line and the key and says " +
			"what to write instead (`line 3: lease_duraton: unknown key; did you mean lease_duration?`). " +
			"`rbd-owner check-config` loads the file as the agent does, without starting anything: run it " +
			"after an edit.",
	}
}

// keyEntry writes one key: its name and type as the tag, then its meaning, its default and what
// it accepts, its words if it takes one of a few, and where to read more.
func keyEntry(b *strings.Builder, k config.Key) {
	fmt.Fprintf(b, ".TP\n\\fB%s\\fR (%s)\n%s\n", manpage.Escape(k.Name), manpage.Escape(k.Type), manpage.Inline(k.Doc))
	def := "Default: " + defaultText(k) + "."
	if k.Default == "" && strings.HasPrefix(k.DefaultNote, "required") {
		def = strings.ToUpper(k.DefaultNote[:1]) + k.DefaultNote[1:] + "."
	}
	fmt.Fprintf(b, ".IP\n%s\n", manpage.Inline(def+" Accepted: "+accepted(k)+"."))
	if len(k.Values) > 0 {
		b.WriteString(".RS\n")
		for _, v := range k.Values {
			item(b, "`"+v.Name+"`", v.Doc)
		}
		b.WriteString(".RE\n")
	}
	if k.See != "" {
		fmt.Fprintf(b, ".IP\n%s\n", manpage.Inline("See `"+DocDir+"/docs/"+page(k.See)+"`."))
	}
}

// leaseBound is the lease rule in words, with the numbers of the code and of the defaults.
func leaseBound() []string {
	c := config.Config{LeaseDuration: config.DefaultLeaseDuration,
		RenewInterval: config.Duration(config.DefaultRenew(config.DefaultLeaseDuration.D())), OSDFailover: config.DefaultOSDFailover}
	d := config.FormatDuration
	return []string{
		fmt.Sprintf("A node that keeps renewing is never judged expired by another node while `renew_interval` + "+
			"the longest wait of one heartbeat + a read's `%s` < `lease_duration`. While its placement group answers, a "+
			"heartbeat waits at most its deadline (`renew_interval`, at most `%s`) + its write's answer (`%s`). When the OSD "+
			"serving it stops, it waits until another OSD serves the group: `osd_failover`, plus `renew_interval` past "+
			"`%s` (the renewals that timed out meanwhile are not sent again).",
			d(config.ClusterCallTimeout), d(config.MaxHeartbeatTimeout), d(config.ClusterCallTimeout), d(config.ClusterCallTimeout)),
		fmt.Sprintf("The defaults give `%s` + `%s` (`osd_failover`) + `%s` = `%s`, less than `%s`. No `renew_interval` "+
			"makes a lease of `%s` + `%s` or less safe. The agent refuses to start with a `lease_duration` outside the "+
			"bound; its error spells out the sum and says which key to change.",
			d(c.RenewInterval.D()), d(c.OSDFailover.D()), d(config.ClusterCallTimeout), d(c.LeaseBound()),
			d(c.LeaseDuration.D()), d(c.OSDFailover.D()), d(config.ClusterCallTimeout)),
	}
}

// section writes a section of paragraphs.
func section(b *strings.Builder, title string, paras ...string) {
	fmt.Fprintf(b, ".SH %s\n", manpage.Quote(title))
	paragraphs(b, paras...)
}

// paragraphs writes each text as a paragraph, `code` in bold.
func paragraphs(b *strings.Builder, paras ...string) {
	for _, p := range paras {
		fmt.Fprintf(b, ".PP\n%s\n", manpage.Inline(p))
	}
}

// item writes a tagged paragraph: tag and text, `code` in bold in both.
func item(b *strings.Builder, tag, text string) {
	fmt.Fprintf(b, ".TP\n%s\n%s\n", manpage.Inline(tag), manpage.Inline(text))
}
