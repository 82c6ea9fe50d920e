package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/rbd-owner/rbd-owner/agent/config"
)

// runCheckConfig loads a config as the agent does at start (config.Load: every key, the
// defaults, the lease bound) and says whether the agent would start with it. It needs no agent
// and no cluster, and links nothing of Ceph's: the packages run it before they restart the
// agent on an upgrade.
func runCheckConfig(args []string, stdout io.Writer) error {
	fs := flags("check-config")
	path := fs.String("config", config.DefaultPath, "config file")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	c, err := config.Load(*path, "")
	if err != nil {
		return err
	}
	ids := make([]string, len(c.Clusters))
	for i, cl := range c.Clusters {
		ids[i] = cl.ID
	}
	clusters := "clusters " + strings.Join(ids, ", ")
	if len(ids) == 0 {
		clusters = "no cluster yet"
	}
	fmt.Fprintf(stdout, "%s: the agent accepts it (node %s, %s; lease_duration %s exceeds the lease bound %s for renew_interval %s)\n",
		*path, c.NodeID, clusters, c.LeaseDuration.D(), c.LeaseBound(), c.RenewInterval.D())
	return nil
}
