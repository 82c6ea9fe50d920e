package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/fault"
	"github.com/rbd-owner/rbd-owner/agent/peercred"
)

// Decode reads a size-limited JSON body and refuses unknown fields and trailing data; on a bad
// body it answers the error itself and returns false.
func Decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, api.MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		if _, rerr := io.Copy(io.Discard, r.Body); rerr != nil {
			err = rerr
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("request body larger than %d bytes", api.MaxBodyBytes)
		}
		WriteError(w, &api.Error{Code: api.CodeInvalidArgument, Message: "bad request body: " + err.Error()})
		return false
	}
	return true
}

// WriteJSON answers v, indented, with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		// only a type that cannot be encoded gets here: a bug, answered as one
		status, buf = http.StatusInternalServerError, bytes.Buffer{}
		fmt.Fprintf(&buf, `{"error":{"code":%q,"message":%q}}`+"\n", api.CodeInternal, "encoding the answer: "+err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// a write error means the caller has gone; there is no one left to tell
	_, _ = w.Write(buf.Bytes())
}

// WriteError answers e with the HTTP status of its code.
func WriteError(w http.ResponseWriter, e *api.Error) {
	WriteJSON(w, api.HTTPStatus(e.Code), api.ErrorBody{Error: e})
}

// APIError turns an error into the API's code (by its kind, package fault) and message, with
// the details an error on its chain gives (api.Detailer: a refusal's holders and next steps).
func APIError(err error) *api.Error {
	e := &api.Error{Code: api.CodeOf(fault.KindOf(err)), Message: err.Error()}
	var d api.Detailer
	if errors.As(err, &d) {
		d.Details(e)
	}
	return e
}

// Call serves a POST call: decode the body (size-limited, no unknown fields), run f with the
// caller's credentials, answer its result or its error.
func Call[Req, Resp any](f func(context.Context, Req, *peercred.Cred) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !Decode(w, r, &req) {
			return
		}
		c, _ := CallerFrom(r.Context())
		resp, err := f(r.Context(), req, c.Peer())
		if err != nil {
			WriteError(w, APIError(err))
			return
		}
		WriteJSON(w, http.StatusOK, resp)
	}
}

// Get serves a GET call whose answer depends only on the query: f's result or its error.
func Get[Resp any](f func(*http.Request) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		resp, err := f(r)
		if err != nil {
			WriteError(w, APIError(err))
			return
		}
		WriteJSON(w, http.StatusOK, resp)
	}
}
