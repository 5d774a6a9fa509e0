package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Code classifies an error that crosses the bus. Codes are stable: callers
// branch on them, so a code's meaning never changes.
type Code string

// The codes troupe uses.
const (
	CodeBadRequest  Code = "bad_request" // the request cannot be decoded or is invalid
	CodeNotFound    Code = "not_found"   // the named thing does not exist
	CodeConflict    Code = "conflict"    // the request clashes with current state
	CodeOverloaded  Code = "overloaded"  // a bounded queue is full; retry later
	CodeUnavailable Code = "unavailable" // nobody answers the subject
	CodeDeadline    Code = "deadline"    // the deadline passed
	CodeCanceled    Code = "canceled"    // the caller gave up
	CodeInternal    Code = "internal"    // anything else
)

// Error is an error with a stable code. Handlers return it to choose the
// code a caller sees; Request returns it for every error reply.
type Error struct {
	Code        Code
	Description string
	cause       error
}

// Errorf returns an *Error with a formatted description. A %w verb in format
// keeps the wrapped error reachable through errors.Is and errors.As locally;
// only the code and text cross the wire.
func Errorf(code Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Description: err.Error(), cause: errors.Unwrap(err)}
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Description }

// Unwrap returns the local cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// CodeOf returns the code of err: the Code of an *Error in its chain, or one
// inferred from well-known errors, or CodeInternal. CodeOf(nil) is "".
func CodeOf(err error) Code {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return CodeDeadline
	case errors.Is(err, context.Canceled):
		return CodeCanceled
	case errors.Is(err, nats.ErrNoResponders):
		return CodeUnavailable
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrMalformed),
		errors.Is(err, ErrUnknownSchema), errors.Is(err, ErrWrongVersion):
		return CodeBadRequest
	}
	return CodeInternal
}
