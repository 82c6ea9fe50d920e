package admin

import (
	"errors"
	"fmt"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/claim"
)

// nextStep is an admin call's refusal with what to do next: the claim layer's facts (Err) and
// the steps for the one who asked (Steps), built here from those facts; Phrase says them after
// the facts in the message. Programs read the steps from the API's error (next_steps).
type nextStep struct {
	Err    error
	Image  string
	Steps  []api.Step
	Phrase string
}

func (e *nextStep) Error() string { return e.Err.Error() + "; " + e.Phrase }

func (e *nextStep) Unwrap() error { return e.Err }

// Details fills in the API's error: the image and the next steps.
func (e *nextStep) Details(out *api.Error) {
	out.Image, out.NextSteps = e.Image, e.Steps
}

// withNextStep wraps err, when it is one of the claim layer's refusals of an admin call (or a
// place whose holds could not be listed), with what to run next; any other error is returned as
// it is.
func withNextStep(err error) error {
	var (
		notFenced *claim.NotFencedError
		elsewhere *claim.FencedElsewhereError
		mapped    *claim.StillMappedError
		unlisted  *claim.UnlistedHoldsError
	)
	switch {
	case errors.As(err, &notFenced):
		run := "rbd-owner fence " + notFenced.Image.String()
		return &nextStep{Err: err, Image: notFenced.Image.String(), Phrase: fmt.Sprintf("run `%s` first", run),
			Steps: []api.Step{{Run: run, Why: "first: a forced release frees only holds an admin fenced (node " + notFenced.Node + "'s is not)"}}}
	case errors.As(err, &elsewhere):
		run := "rbd-owner unfence " + elsewhere.Image.String()
		return &nextStep{Err: err, Image: elsewhere.Image.String(), Phrase: fmt.Sprintf("run `%s` there", run),
			Steps: []api.Step{{Run: run, Why: "on node " + elsewhere.Node + ", whose agent fenced those mappings"}}}
	case errors.As(err, &mapped):
		run := "rbd unmap " + mapped.Device
		return &nextStep{Err: err, Image: mapped.Image.String(), Phrase: fmt.Sprintf("unmap it first (%s)", run),
			Steps: []api.Step{{Run: run, Why: "first, on this node: the fence is lifted only once its mapping is gone"}}}
	case errors.As(err, &unlisted):
		list := "rbd-owner claims --pool " + unlisted.Pool
		return &nextStep{Err: err, Phrase: fmt.Sprintf("fence them one at a time (`rbd-owner fence IMAGE`, `%s`)", list),
			Steps: []api.Step{{Run: list, Why: "the claims of " + unlisted.Place + ": node " + unlisted.Node + "'s holds are among them"},
				{Run: "rbd-owner fence IMAGE", Why: "each of node " + unlisted.Node + "'s holds, one at a time"}}}
	}
	return err
}
