"""OpenAI's Agent RFT shapes: a job's tool endpoints and a row's tool schemas
(``protocol``), the function_call protocol with its failure rules
(``tool_client``), and where tools and endpoint graders may connect
(``egress``)."""
