package cyc

const limit = 3

type counter int

// Inc is counter's one method.
func (c counter) Inc() counter { return c + 1 }
