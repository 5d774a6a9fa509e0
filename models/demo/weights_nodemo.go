//go:build nodemo

package demo

// weights is empty: this binary was built without the checkpoint.
var weights string
