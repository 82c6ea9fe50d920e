package saga

import (
	"errors"
	"fmt"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/config"
)

// Refusal is a map refused because other nodes hold the image: the claim layer's facts (Held:
// who holds it, why this request may not have it) and what this caller may do next (Steps),
// built here once from the caller's role, the node's takeover_policy and the holders. Advice
// is the same steps in the one phrase a person reads after the facts ("" when the reason says
// it: a takeover that waits for a lease). Programs read the steps from the API's error
// (api.Error.NextSteps); nothing reads them back out of a message.
type Refusal struct {
	Err    error // the claim's refusal, with its context ("acquire rbd/img: …")
	Held   *claim.HeldError
	Spec   string // the image as a command's argument
	Steps  []api.Step
	Advice string
}

func (r *Refusal) Error() string {
	if r.Advice == "" {
		return r.Err.Error()
	}
	return r.Err.Error() + "; " + r.Advice
}

func (r *Refusal) Unwrap() error { return r.Err }

// Details fills in the API's error: the claim's facts (claim.HeldError.Details), then this
// caller's next steps.
func (r *Refusal) Details(e *api.Error) {
	if r.Held != nil {
		r.Held.Details(e)
	} else {
		e.Image = r.Spec
	}
	e.NextSteps, e.Advice = r.Steps, r.Advice
}

// refusal wraps err, when it is a claim refusal, with this caller's next steps; any other
// error is returned as it is.
func (s *Sagas) refusal(c Caller, t target, err error) error {
	var lost *claim.LostError
	if errors.As(err, &lost) && lost.OwnFenced {
		release := "rbd-owner release --force " + t.img.String()
		if len(s.Config.Clusters) > 1 {
			release = "rbd-owner release --cluster " + t.key.Cluster + " --force " + t.img.String()
		}
		return &Refusal{Err: err, Spec: t.img.String(), Steps: []api.Step{{Run: release, Why: "before mapping again: an admin fenced this node's hold"}},
			Advice: "release it (rbd-owner release --force) before mapping again"}
	}
	var held *claim.HeldError
	if !errors.As(err, &held) {
		return err
	}
	steps, advice := s.nextSteps(c, t, held)
	return &Refusal{Err: err, Held: held, Spec: t.img.String(), Steps: steps, Advice: advice}
}

// nextSteps is what the one reading a refusal may do, phrased for its caller: an admin may
// fence the holder (the next map then takes it over) or take it over once its lease expired;
// a CSI-role caller (ceph-csi) cannot fence and has to ask an admin, or have the policy
// changed. A map that was a takeover already waits for the holder's lease: its steps are the
// retry and the fence, and the reason says it (no advice).
func (s *Sagas) nextSteps(c Caller, t target, held *claim.HeldError) ([]api.Step, string) {
	holders := held.Holders
	who, node := "its holders are", "NODE"
	if len(holders) == 1 {
		who, node = "node "+holders[0].NodeID+" is", holders[0].NodeID
	}
	cluster := ""
	if len(s.Config.Clusters) > 1 {
		cluster = "--cluster " + t.key.Cluster + " "
	}
	img := cluster + t.img.String()
	nodeRun, fenceRun := "rbd-owner fence "+cluster+"--node "+node, "rbd-owner fence "+img
	// a hold an admin fenced is taken over by the next map whatever the policy (TakeFenced):
	// the fence is the whole next step, no release --force
	fence, nodeFence := "`"+fenceRun+"`", "`"+nodeRun+"`"
	if held.Takeover {
		retry := api.Step{Run: "rbd-owner map --takeover " + img, Why: "retry once " + who + " past its lease, unless it renews (retry_after_seconds)"}
		if !c.Admin {
			retry = api.Step{Why: "the next NodeStage retries the map; it takes the image over once " + who + " past its lease, unless it renews (retry_after_seconds)"}
		}
		switch held.Block {
		case claim.BlockNoFenceAddr:
			return []api.Step{{Run: "rbd-owner status", Why: "on node " + held.BlockedBy + ": it recorded no address to fence; if it is dead, an admin frees the image with rbd-owner release --force " + img}}, ""
		case claim.BlockAlive:
			return []api.Step{retry, {Why: "node " + held.BlockedBy + " is alive: the takeover waits until its mapping is recorded or it stops"}}, ""
		}
		return []api.Step{retry, {Run: nodeRun, Why: "if " + who + " dead, by an admin on any node: every hold of that node; then map again"}}, ""
	}
	if c.Admin {
		return []api.Step{
				{Run: nodeRun, Why: "if " + who + " dead: every hold of that node; then map again"},
				{Run: "rbd-owner map --takeover " + img, Why: "once its lease has expired"},
				{Run: fenceRun, Why: "this image only; then map again"}},
			fmt.Sprintf("if %s dead: run %s (every hold of that node; then map again), map with --takeover once its lease has expired, or run %s (this image only; then map again)", who, nodeFence, fence)
	}
	if s.Config.TakeoverPolicy == config.TakeoverAfterFence {
		return []api.Step{{Run: nodeRun, Why: "if " + who + " dead, by an admin on any node (or Kubernetes' out-of-service taint makes ceph-csi fence it): the next NodeStage then maps it"}},
			fmt.Sprintf("under takeover_policy: after-fence a map takes it over once the holder's mapping is on the cluster's blocklist: if %s dead, ask an admin to run %s on any node (or have Kubernetes' out-of-service taint make ceph-csi fence it): the next NodeStage then maps it", who, nodeFence)
	}
	return []api.Step{
			{Run: nodeRun, Why: "if " + who + " dead, by an admin on any node: every hold of that node; the next NodeStage then maps it"},
			{Run: fenceRun, Why: "this image only, by an admin"},
			{Why: "set takeover_policy: after-fence (maps take over holds already blocklisted) or after-lease-expiry (also an expired lease)"}},
		fmt.Sprintf("this caller (CSI role) may not take it over under takeover_policy: manual: if %s dead, ask an admin to run %s on any node (every hold of that node; %s fences this image only): the next NodeStage then maps it; or set takeover_policy: after-fence (maps take over holds already blocklisted) or after-lease-expiry (also an expired lease)", who, nodeFence, fence)
}
