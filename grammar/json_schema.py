JSON_OBJECT_GBNF = ""
def json_schema_to_gbnf(s): raise NotImplementedError
