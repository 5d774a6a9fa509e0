// Package hubtest serves a model repository over the Hugging Face Hub's
// HTTP API (the revision API and resolve, LFS files by a redirect to a
// path that honours ranges), for tests of what fetches from a Hub.
package hubtest
